"""pinstage.cache: a restart cache of checkpoints in memory that outlives every process.

An entry is a checkpoint's own bytes in a directory on hugetlbfs or tmpfs (the setting
PINSTAGE_CACHE_DIR, default /dev/shm/pinstage-<uid>), beside a manifest of the source's
identity. The page cache's reclaim and `drop_caches` leave it alone, so a process started
after them maps it in place instead of reading the disk again:

    pinstage.cache.put("model/")                         # fill the entry once
    t = pinstage.load_file("model/", worker=w, mode="map", cache="use")   # a hit: mapped
    pinstage.cache.ls(); pinstage.cache.prune(max_bytes=64 << 30)

Every function mirrors the C++ WeightCache (include/pinstage/cache.h) and the CLI's
`pinstage cache` (docs/cache.md); `dir` overrides PINSTAGE_CACHE_DIR for one call. The
directory must be the user's own, mode 0700 and not a symlink: anything else is refused
(pinstage.Error naming the fix) before an entry is read or written.
"""
import os

from . import _pinstage
from ._pinstage import InvalidArgumentError

# The values of load_file / safe_open / load_to_device's cache=. "off" is the default: an
# entry takes memory that no reclaim gives back (tmpfs or reserved huge pages), and even
# "use" opens (and on first use creates) a directory outside the path the caller named,
# so both are the caller's choice, never a side effect of a load.
USES = ("off", "use", "fill")
DEFAULT = "off"


def _dir(dir, who):
    """None (PINSTAGE_CACHE_DIR, else the default) or the directory as a str."""
    if dir is None:
        return None
    if not isinstance(dir, (str, os.PathLike)):
        raise TypeError(f"pinstage.cache.{who}(): dir must be str or os.PathLike, "
                        f"not {type(dir).__name__}")
    return os.fspath(dir)


def _path(path, who, name="path"):
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"pinstage.cache.{who}(): {name} must be str or os.PathLike, "
                        f"not {type(path).__name__}")
    return os.fspath(path)


def use(value, who):
    """`value` of a load's cache= checked: one of USES (TypeError / InvalidArgumentError
    naming `who` otherwise)."""
    if not isinstance(value, str):
        raise TypeError(f"{who}(): cache must be str ('off', 'use' or 'fill'), "
                        f"not {type(value).__name__}")
    if value not in USES:
        raise InvalidArgumentError(
            f"{who}(): cache must be 'off' (read the source), 'use' (map an entry that is "
            f"there, else read the source) or 'fill' (make the entry when it is missing or "
            f"stale, then map it), got {value!r}")
    return value


def default_dir():
    """The directory the cache uses when no `dir` is given: PINSTAGE_CACHE_DIR, else
    /dev/shm/pinstage-<uid>."""
    return _pinstage._cache_default_dir()


def info(dir=None):
    """The cache directory: {"path", "fs" ("hugetlbfs" or "tmpfs"), "page_bytes" (the huge
    page size on hugetlbfs), "huge" (whether files get 2 MiB pages: "hugetlbfs", or the
    tmpfs mount's huge= option "never", "within_size", "always", "advise"; "unknown"),
    "free_bytes", "used_bytes", "entries"}; the directory is made 0700 when missing."""
    return _pinstage._cache_info(_dir(dir, "info"))


def lookup(path, *, dir=None):
    """Whether checkpoint `path` has an entry: {"state": "hit" | "miss" | "stale", "key",
    "entry_path" (a checkpoint any loader opens; "" unless a hit), "reason" (for "stale",
    the file and field that changed)}. Reads the manifest and stats the files only."""
    return _pinstage._cache_lookup(_path(path, "lookup"), _dir(dir, "lookup"))


def put(path, *, dir=None, progress=None, max_bytes=None, threads=0, numa_node=-1):
    """Fills the entry of checkpoint `path` when it is missing or stale: the bytes are
    copied under a temporary name, then renamed, so no reader sees a partial entry; a
    second filler of the same checkpoint waits for the first and finds a hit. Returns the
    lookup dict ("filled", or "hit" when it was there). `progress(done, total)` is called
    as bytes are copied, with the GIL taken; an exception it raises stops the fill (nothing
    is left) and is raised here. `max_bytes`: the cache's limit, a fill that would pass it
    is refused before anything is written (None: the file system's free space, or the
    huge-page reservation, bounds it). `threads`: copying threads (0: every core).
    `numa_node`: the node the entry's pages are bound to (its device's, so that a hit maps
    memory local to it); -1 leaves them to this process's memory policy."""
    if progress is not None and not callable(progress):
        raise TypeError(f"pinstage.cache.put(): progress must be a callable (done, total) or "
                        f"None, not {type(progress).__name__}")
    limit = 0 if max_bytes is None else _bytes(max_bytes, "put")
    if limit == 0 and max_bytes is not None:
        raise InvalidArgumentError("pinstage.cache.put(): max_bytes=0 leaves no room for an "
                                   "entry; pass None for no limit")
    if isinstance(threads, bool) or not isinstance(threads, int) or not 0 <= threads < 1 << 31:
        raise InvalidArgumentError(f"pinstage.cache.put(): threads must be an int in "
                                   f"[0, 2**31), got {threads!r}")
    if isinstance(numa_node, bool) or not isinstance(numa_node, int) or \
            not -1 <= numa_node < 1 << 31:
        raise InvalidArgumentError(f"pinstage.cache.put(): numa_node must be an int >= -1, "
                                   f"got {numa_node!r}")
    return _pinstage._cache_put(_path(path, "put"), _dir(dir, "put"), progress, limit, threads,
                                numa_node)


def ls(*, dir=None):
    """Everything in the directory, sorted by key: [{"key", "source", "bytes",
    "last_use_ns" (the last hit or fill, CLOCK_REALTIME ns), "state" ("ok", "stale" or
    "temp": a filler's temporary), "reason"}]."""
    return _pinstage._cache_ls(_dir(dir, "ls"))


def rm(key_or_path, *, dir=None):
    """Removes an entry by its key or its source's path. A process that maps it keeps its
    bytes until it unmaps them (an unlinked file lives while mapped); a new load misses.
    pinstage.Error (code 'not_found') naming the key when there is no such entry."""
    return _pinstage._cache_rm(_path(key_or_path, "rm", "key_or_path"), _dir(dir, "rm"))


def prune(max_bytes=None, *, dir=None):
    """Removes leftover temporaries whose filler is gone, then stale entries, then the
    least recently used until the entries take at most `max_bytes` (None: no bound).
    Returns {"temps", "stale", "evicted" (counts), "freed_bytes", "removed" (the keys)}."""
    limit = None if max_bytes is None else _bytes(max_bytes, "prune")
    return _pinstage._cache_prune(limit, _dir(dir, "prune"))


def _bytes(value, who):
    """max_bytes checked: an int in [0, 2**64)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"pinstage.cache.{who}(): max_bytes must be int or None, "
                        f"not {type(value).__name__}")
    if not 0 <= value < 1 << 64:
        raise InvalidArgumentError(f"pinstage.cache.{who}(): max_bytes must be in [0, 2**64), "
                                   f"got {value}")
    return value
