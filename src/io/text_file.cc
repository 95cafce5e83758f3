#include "io/text_file.h"

#include <fstream>

namespace dsinfer::io {

Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) return IoError("cannot write " + path);
  return Status::Ok();
}

}  // namespace dsinfer::io
