// ShardCleanupOnSignal: the handler touches no heap and no lock (getdents64,
// fstatat and unlinkat on a directory opened beforehand), then chains to the
// handler it replaced.
#include "shard_cleanup.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <memory>
#include <string_view>
#include <vector>

#include "pinstage/checkpoint.h"
#include "pinstage/error.h"

namespace pinstage::cli {
namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

struct State {
  int dir_fd = -1;
  bool had_index = false;
  ino_t index_inode = 0;
  std::vector<std::string> before;  // the directory's names when the write began
  struct sigaction previous[std::size(kSignals)] = {};
};
std::atomic<State*> g_state{nullptr};

bool is_shard_name(const char* name) {
  const size_t n = std::strlen(name);
  constexpr std::string_view kHead = "model-", kTail = ".safetensors";
  return n > kHead.size() + kTail.size() && std::strncmp(name, kHead.data(), kHead.size()) == 0 &&
         std::strcmp(name + n - kTail.size(), kTail.data()) == 0;
}

bool was_there(const State& s, const char* name) {
  for (const std::string& b : s.before)
    if (std::strcmp(b.c_str(), name) == 0) return true;
  return false;
}

// The index was replaced or made: the shards are a checkpoint now.
bool index_committed(const State& s) {
  struct stat st {};
  if (::fstatat(s.dir_fd, kCheckpointIndexName, &st, 0) != 0) return false;
  return !s.had_index || st.st_ino != s.index_inode;
}

void remove_new_shards(const State& s) {
  alignas(8) static char buf[16384];
  for (int pass = 0; pass < 2; ++pass) {  // a removal during a listing may hide an entry
    ::lseek(s.dir_fd, 0, SEEK_SET);
    for (ssize_t n; (n = ::getdents64(s.dir_fd, buf, sizeof buf)) > 0;) {
      for (ssize_t off = 0; off < n;) {
        const auto* d = reinterpret_cast<const struct dirent64*>(buf + off);
        off += d->d_reclen;
        if (is_shard_name(d->d_name) && !was_there(s, d->d_name))
          ::unlinkat(s.dir_fd, d->d_name, 0);
      }
    }
  }
}

void on_signal(int sig) {
  State* s = g_state.load();
  if (s != nullptr && !index_committed(*s)) remove_new_shards(*s);
  for (size_t i = 0; s != nullptr && i < std::size(kSignals); ++i) {
    const struct sigaction& prev = s->previous[i];
    if (kSignals[i] != sig || (prev.sa_flags & SA_SIGINFO) != 0 || prev.sa_handler == SIG_DFL ||
        prev.sa_handler == SIG_IGN)
      continue;
    prev.sa_handler(sig);  // the temporary files' removal; it re-raises the signal
    return;
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

ShardCleanupOnSignal::ShardCleanupOnSignal(const std::string& dir) {
  auto s = std::make_unique<State>();
  s->dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (s->dir_fd < 0)
    throw Error(ErrorCode::io,
                "--out '" + dir + "': cannot open the directory: " + std::strerror(errno));
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    s->before.push_back(e.path().filename().string());
  struct stat st {};
  s->had_index = ::fstatat(s->dir_fd, kCheckpointIndexName, &st, 0) == 0;
  s->index_inode = st.st_ino;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  g_state.store(s.release());
  for (size_t i = 0; i < std::size(kSignals); ++i)
    ::sigaction(kSignals[i], &sa, &g_state.load()->previous[i]);
}

ShardCleanupOnSignal::~ShardCleanupOnSignal() {
  State* s = g_state.load();
  for (size_t i = 0; i < std::size(kSignals); ++i)
    ::sigaction(kSignals[i], &s->previous[i], nullptr);
  g_state.store(nullptr);
  ::close(s->dir_fd);
  delete s;
}

}  // namespace pinstage::cli
