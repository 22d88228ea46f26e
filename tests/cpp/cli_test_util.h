// Runs a shell command line (the CLI, in tests) and returns its exit status and stdout.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace pinstage::test {

struct CommandResult {
  int status = -1;     // exit status; -1 when it did not exit normally
  std::string output;  // what the command wrote to stdout
};

inline CommandResult run_command(const std::string& command_line) {
  CommandResult r;
  FILE* pipe = popen(command_line.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

}  // namespace pinstage::test
