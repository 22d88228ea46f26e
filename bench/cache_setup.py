"""The restart cache's part of bench/peers.py (issue 50, docs/cache.md): the cache
directories its `pinstage_cache*` arms load from, filled once by the parent before the
rounds, and the machine-wide page-cache drop of `--modes dropped`.

  tmpfs      a directory of /dev/shm made for the run (mode 0700), 4 KiB pages
  hugetlbfs  2 MiB pages reserved through /proc/sys/vm/nr_hugepages (only what the
             entry needs beyond the free ones: one page per started 2 MiB of each of
             its files, plus its manifest and one spare) and a hugetlbfs mounted for the
             run (pagesize=2M, size= those pages, so that statfs reports them free,
             mode=0700, this user's uid and gid); both as root. When the
             kernel cannot give the pages (fragmented memory), the huge arms fail, saying
             how many it gave; the others run on.
  tmpfs_huge a tmpfs mounted for the run with huge=within_size (size= the entry plus 64
             MiB, mode=0700, this user's uid and gid), as root: 2 MiB shmem pages with no
             reservation, where the kernel's shmem THP allows a mount to ask for them.

Everything is undone at the end: the tmpfs directory removed, the hugetlbfs and huge tmpfs
unmounted and their mount points removed, nr_hugepages set back to what it was.
"""
import os
import pathlib
import shutil
import subprocess
import tempfile
import time

HUGE_PAGE = 2 << 20
NR_HUGEPAGES = pathlib.Path("/proc/sys/vm/nr_hugepages")
DROP_CACHES = pathlib.Path("/proc/sys/vm/drop_caches")


def drop_caches():
    """sync, then `echo 3 > /proc/sys/vm/drop_caches`: the page cache, dentries and inodes
    of the whole machine dropped (tmpfs and hugetlbfs pages are not page cache: they stay).
    Needs root."""
    os.sync()
    try:
        DROP_CACHES.write_text("3\n")
    except PermissionError:
        raise RuntimeError("--modes dropped writes 3 to /proc/sys/vm/drop_caches, which "
                           "needs root: run peers.py as root (sudo), or use --modes cold "
                           "(each shard dropped with posix_fadvise)") from None


def meminfo(key):
    with open("/proc/meminfo") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name == key:
                return int(rest.split()[0])
    raise RuntimeError(f"/proc/meminfo has no {key}")


def huge_pages_for(d):
    """2 MiB pages an entry of checkpoint folder `d` takes on hugetlbfs: each file rounded
    up to whole pages, plus its manifest and one spare."""
    sizes = [p.stat().st_size for p in d.iterdir() if p.is_file()]
    return sum(max(1, -(-s // HUGE_PAGE)) for s in sizes) + 2


class CacheDirs:
    """The run's cache directories ({"tmpfs": path, "hugetlbfs": path}, those asked for),
    each holding the entry of the checkpoint once fill() ran; a context manager that undoes
    everything it did. `errors` says why a kind could not be made."""

    def __init__(self, kinds):
        self.kinds = list(kinds)
        self.dirs, self.errors, self.fills = {}, {}, {}
        self._nr_before = None
        self._mounts = []

    def __enter__(self):
        return self

    def make(self, d):
        """Makes the directories for checkpoint folder `d`."""
        if "tmpfs" in self.kinds:
            self.dirs["tmpfs"] = tempfile.mkdtemp(prefix="pinstage-peers-cache-", dir="/dev/shm")
        if "hugetlbfs" in self.kinds:
            try:
                self.dirs["hugetlbfs"] = self._mount_huge(huge_pages_for(d))
            except (RuntimeError, OSError) as e:
                self.errors["hugetlbfs"] = f"no hugetlbfs cache: {e}"
        if "tmpfs_huge" in self.kinds:
            size = sum(p.stat().st_size for p in d.iterdir() if p.is_file()) + (64 << 20)
            try:
                self.dirs["tmpfs_huge"] = self._mount("tmpfs", f"huge=within_size,size={size}")
            except (RuntimeError, OSError) as e:
                self.errors["tmpfs_huge"] = f"no huge tmpfs cache: {e}"

    def _mount_huge(self, pages):
        if meminfo("Hugepagesize") != HUGE_PAGE >> 10:
            raise RuntimeError(f"the default huge page is {meminfo('Hugepagesize')} kB, "
                               "not 2048 kB")
        self._nr_before = int(NR_HUGEPAGES.read_text())
        missing = pages - meminfo("HugePages_Free")
        if missing > 0:
            NR_HUGEPAGES.write_text(f"{self._nr_before + missing}\n")
        free = meminfo("HugePages_Free")
        if free < pages:
            raise RuntimeError(f"the entry needs {pages} free 2 MiB pages; the kernel gave "
                               f"{free} (memory too fragmented: echo 1 > "
                               "/proc/sys/vm/compact_memory, or reserve them at boot with "
                               "hugepages=N)")
        return self._mount("hugetlbfs", f"pagesize=2M,size={pages * HUGE_PAGE}")

    def _mount(self, fs, options):
        """A file system of type `fs` mounted with `options` on a new /var/tmp folder that
        only this user may use; its mount point."""
        point = tempfile.mkdtemp(prefix=f"pinstage-peers-{fs}-", dir="/var/tmp")
        done = subprocess.run(["mount", "-t", fs, "-o", f"{options},mode=0700,"
                               f"uid={os.geteuid()},gid={os.getegid()}", "none", point],
                              capture_output=True, text=True)
        if done.returncode != 0:
            os.rmdir(point)
            raise RuntimeError(f"mount -t {fs} exited {done.returncode}: "
                               f"{done.stderr.strip()} (it needs root)")
        self._mounts.append(point)
        return point

    def fill(self, pinstage, d):
        """The checkpoint's entry put in each directory (timed: the `fill_s` of the JSON)."""
        for kind, path in self.dirs.items():
            t0 = time.perf_counter()
            got = pinstage.cache.put(d, dir=path)
            self.fills[kind] = {"state": got["state"], "seconds": time.perf_counter() - t0,
                                "dir": path, "info": pinstage.cache.info(dir=path)}

    def __exit__(self, *exc):
        if "tmpfs" in self.dirs:
            shutil.rmtree(self.dirs["tmpfs"], ignore_errors=True)
        for point in self._mounts:
            done = subprocess.run(["umount", point], capture_output=True, text=True)
            if done.returncode != 0:  # still mapped by this process: detached now, freed
                done = subprocess.run(["umount", "-l", point],  # with its last user
                                      capture_output=True, text=True)
            if done.returncode == 0:
                os.rmdir(point)
            else:
                print(f"peers.py: umount {point} failed: {done.stderr.strip()}")
        if self._nr_before is not None:
            NR_HUGEPAGES.write_text(f"{self._nr_before}\n")
        return False
