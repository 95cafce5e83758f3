#include "io/text_file.h"

#include <fstream>
#include <sstream>

namespace dsinfer::io {

Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) return IoError("cannot write " + path);
  return Status::Ok();
}

Result<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError("cannot open " + path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return IoError("cannot read " + path);
  return text.str();
}

}  // namespace dsinfer::io
