// The server's view of an inference engine. Production wraps runtime::Engine (RuntimeEnginePort);
// tests substitute a scripted engine so the HTTP layer can be checked token by token.
#pragma once

#include <chrono>
#include <memory>

#include "core/status.h"
#include "runtime/engine.h"

namespace dsinfer::server {

class EnginePort {
 public:
  virtual ~EnginePort() = default;
  virtual Result<std::shared_ptr<runtime::RequestStream>> Submit(runtime::RequestParams params) = 0;
  virtual runtime::EngineStats Stats() const = 0;
  virtual bool ready() const = 0;
  virtual void Shutdown(std::chrono::steady_clock::time_point deadline) = 0;
  // Drops the prefix cache; FailedPrecondition while requests run (runtime::Engine).
  virtual Status FlushPrefixCache() = 0;
};

// Forwards to a runtime::Engine it does not own.
class RuntimeEnginePort final : public EnginePort {
 public:
  explicit RuntimeEnginePort(runtime::Engine& engine) : engine_(engine) {}
  Result<std::shared_ptr<runtime::RequestStream>> Submit(runtime::RequestParams params) override {
    return engine_.Submit(std::move(params));
  }
  runtime::EngineStats Stats() const override { return engine_.Stats(); }
  bool ready() const override { return engine_.ready(); }
  void Shutdown(std::chrono::steady_clock::time_point deadline) override {
    engine_.Shutdown(deadline);
  }
  Status FlushPrefixCache() override { return engine_.FlushPrefixCache(); }

 private:
  runtime::Engine& engine_;
};

}  // namespace dsinfer::server
