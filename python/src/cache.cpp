// The restart cache for Python (python/pinstage/cache.py wraps these): WeightCache's
// info, lookup, fill, list, remove and prune as dicts, each opening the directory anew
// (PINSTAGE_CACHE_DIR or `dir`) so that every call checks its owner and mode.
// docs/cache.md, "Python".
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "common.h"
#include "load_common.h"
#include "pinstage/cache.h"
#include "pinstage/checkpoint.h"

namespace pinstage::python {

namespace {

WeightCache open_cache(const std::optional<std::string>& dir, const char* who) {
  if (dir) require_no_nul(*dir, std::string(who) + "(): dir");
  return WeightCache::open(dir);
}

py::dict lookup_dict(const CacheLookup& l) { return fields_dict(report_fields(l)); }

py::dict info(const std::optional<std::string>& dir) {
  const CacheDirInfo i = [&] {
    const GilReleased nogil;
    return open_cache(dir, "pinstage.cache.info").info();
  }();
  return fields_dict(report_fields(i));
}

py::dict lookup(const py::object& path, const std::optional<std::string>& dir) {
  const std::string p = path_arg(path, "pinstage.cache.lookup(): path");
  return lookup_dict([&] {
    const GilReleased nogil;
    const Checkpoint source = Checkpoint::open(p);
    return open_cache(dir, "pinstage.cache.lookup").lookup(source);
  }());
}

// The fill without the GIL, Python's progress callable relayed as a load's is (its
// exception stops the fill, which removes its temporary, and is raised here).
py::dict put(const py::object& path, const std::optional<std::string>& dir,
             const py::object& progress, uint64_t max_bytes, int threads, int numa_node) {
  const std::string p = path_arg(path, "pinstage.cache.put(): path");
  ProgressRelay relay(progress);
  CacheFillOptions o;
  o.max_bytes = max_bytes;
  o.threads = threads;
  o.numa_node = numa_node;
  if (!progress.is_none())
    o.progress = [&relay](uint64_t done, uint64_t total) { relay.call(relay.fn, done, total); };
  CacheLookup l;
  try {
    const GilReleased nogil;
    const Checkpoint source = Checkpoint::open(p);
    l = open_cache(dir, "pinstage.cache.put").fill(source, o);
  } catch (const ProgressStopped&) {
    relay.rethrow();
  }
  return lookup_dict(l);
}

py::list ls(const std::optional<std::string>& dir) {
  const auto entries = [&] {
    const GilReleased nogil;
    return open_cache(dir, "pinstage.cache.ls").list();
  }();
  py::list out;
  for (const CacheEntryInfo& e : entries) out.append(fields_dict(report_fields(e)));
  return out;
}

void rm(const py::object& key_or_path, const std::optional<std::string>& dir) {
  const std::string k = path_arg(key_or_path, "pinstage.cache.rm(): key_or_path");
  const GilReleased nogil;
  open_cache(dir, "pinstage.cache.rm").remove(k);
}

py::dict prune(std::optional<uint64_t> max_bytes, const std::optional<std::string>& dir) {
  const CachePruneReport r = [&] {
    const GilReleased nogil;
    return open_cache(dir, "pinstage.cache.prune").prune(max_bytes);
  }();
  return fields_dict(report_fields(r));
}

}  // namespace

// The keys of a dict of T, for its doc ("path, fs, ..."): its serialiser's, so the doc
// follows report_fields.
template <class T>
std::string keys_of() {
  std::string keys;
  for (const ReportField& f : report_fields(T{})) keys += (keys.empty() ? "" : ", ") + f.key;
  return keys;
}

void bind_cache(py::module_& m) {
  const auto dir = py::arg("dir") = py::none();
  m.def("_cache_default_dir", &default_cache_dir,
        function_doc("_cache_default_dir() -> str",
                     "PINSTAGE_CACHE_DIR, or /dev/shm/pinstage-<uid> when it is unset."));
  m.def("_cache_info", &info, dir,
        function_doc("_cache_info(dir: str | None = None) -> dict[str, Any]",
                     "The cache directory: " + keys_of<CacheDirInfo>() + "."));
  m.def("_cache_lookup", &lookup, py::arg("path"), dir,
        function_doc("_cache_lookup(path: str | os.PathLike[str], dir: str | None = None) -> "
                     "dict[str, Any]",
                     "What the cache holds for the checkpoint: " + keys_of<CacheLookup>() + "."));
  m.def("_cache_put", &put, py::arg("path"), dir, py::arg("progress") = py::none(),
        py::arg("max_bytes") = 0, py::arg("threads") = 0, py::arg("numa_node") = -1,
        function_doc("_cache_put(path: str | os.PathLike[str], dir: str | None = None, "
                     "progress: Callable[[int, int], None] | None = None, max_bytes: int = 0, "
                     "threads: int = 0, numa_node: int = -1) -> dict[str, Any]",
                     "Fills the checkpoint's entry when missing or stale (the lookup dict)."));
  m.def("_cache_ls", &ls, dir,
        function_doc("_cache_ls(dir: str | None = None) -> list[dict[str, Any]]",
                     "Every entry and temporary: " + keys_of<CacheEntryInfo>() + "."));
  m.def("_cache_rm", &rm, py::arg("key_or_path"), dir,
        function_doc("_cache_rm(key_or_path: str | os.PathLike[str], dir: str | None = None) "
                     "-> None",
                     "Removes the entry named by its key or its source's path."));
  m.def("_cache_prune", &prune, py::arg("max_bytes") = py::none(), dir,
        function_doc("_cache_prune(max_bytes: int | None = None, dir: str | None = None) -> "
                     "dict[str, Any]",
                     "Removes dead fillers' temporaries, stale entries, then the least "
                     "recently used down to max_bytes: " +
                         keys_of<CachePruneReport>() + "."));
}

}  // namespace pinstage::python
