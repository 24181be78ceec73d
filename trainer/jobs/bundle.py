"""Code bundles: a directory packed by `submit --workdir`, content-addressed in the cluster's store, unpacked
by the job's task (trainer.slurm.task) into the job's work directory on each node.

What is packed: in a git repository, the files git tracks under the directory (their working-tree contents);
elsewhere every file except those a ``.gpufleetignore`` names (one fnmatch pattern a line, ``#`` comments; a
pattern matches a path relative to the directory or any of its components). The archive is reproducible
(sorted, mtime 0, owner root, modes 0644/0755), so the same files give the same SHA-256 of the tar stream, and
the bundle lives gzipped at ``<bucket>/teams/<team>/code/<sha256>.tar.gz``: a second submit of unchanged files hashes them
and uploads nothing (compression happens only for an upload). The task checks the hash after download.
"""
from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from trainer.errors import UsageError
from trainer.loop.storage import open_store

MB = 1000 * 1000
MAX_BYTES = 200 * MB  # the files of a bundle, before compression
IGNORE_FILE = ".gpufleetignore"
PREFIX = "code/"


@dataclass(frozen=True)
class Bundle:
    tar: bytes        # the reproducible tar stream
    sha256: str       # of ``tar``
    files: int
    size: int         # bytes of the files

    @property
    def key(self) -> str:
        return f"{PREFIX}{self.sha256}.tar.gz"

    def gzipped(self) -> bytes:
        return gzip.compress(self.tar, compresslevel=6, mtime=0)


def _git_files(root: Path) -> list[str] | None:
    """The files git tracks under root (relative paths), or None when root is not in a git work tree."""
    try:
        inside = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
                                capture_output=True, text=True)
    except FileNotFoundError:
        return None
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        return None
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached"], capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p and (root / p).is_file()]


def _ignore_patterns(root: Path) -> list[str]:
    path = root / IGNORE_FILE
    if not path.exists():
        return []
    return [ln.strip().rstrip("/") for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def ignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    return any(fnmatch.fnmatchcase(rel, p) or any(fnmatch.fnmatchcase(part, p) for part in parts) for p in patterns)


def files_of(root: str | os.PathLike) -> list[str]:
    """The relative paths a bundle of ``root`` holds, sorted."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"--workdir: {root} is not a directory")
    tracked = _git_files(root)
    if tracked is not None:
        return sorted(tracked)
    patterns = _ignore_patterns(root)
    found = []
    for dirpath, dirnames, names in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()

        def rel(name: str) -> str:
            return name if rel_dir == "." else f"{rel_dir}/{name}"

        dirnames[:] = sorted(d for d in dirnames if not ignored(rel(d), patterns))
        found += [rel(n) for n in names if not ignored(rel(n), patterns)]
    return sorted(found)


def pack(root: str | os.PathLike, max_bytes: int = MAX_BYTES) -> Bundle:
    """The reproducible .tar.gz of ``root``; a UsageError beyond ``max_bytes`` of files, naming the largest."""
    root = Path(root)
    rels = files_of(root)
    if not rels:
        raise UsageError(f"--workdir: {root} has no files to pack")
    sizes = {rel: (root / rel).stat().st_size for rel in rels}
    total = sum(sizes.values())
    if total > max_bytes:
        largest = sorted(sizes, key=sizes.get, reverse=True)[:3]
        raise UsageError(f"--workdir: {root} holds {total / MB:.1f} MB to pack, over the bundle limit of "
                         f"{max_bytes / MB:.0f} MB (largest: {', '.join(f'{r} {sizes[r] / MB:.1f} MB' for r in largest)}); "
                         f"leave data out with {IGNORE_FILE} (or .gitignore) and read it from object storage")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in rels:
            path = root / rel
            info = tarfile.TarInfo(rel)
            info.size = sizes[rel]
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(path, "rb") as f:
                tar.addfile(info, f)
    data = raw.getvalue()
    return Bundle(data, hashlib.sha256(data).hexdigest(), len(rels), total)


def upload(bundle: Bundle, base: str) -> tuple[str, bool]:
    """Put the bundle under <base>code/ (``base``: a team's store URI, trainer.jobs.layout.team_base) unless it
    is there already: (its URI, whether it was uploaded)."""
    store = open_store(base)
    if store.exists(bundle.key):
        return base + bundle.key, False
    store.write_bytes(bundle.key, bundle.gzipped())
    return base + bundle.key, True


def _digest(path: Path) -> str:
    """The SHA-256 of the bundle's tar stream (what its name carries)."""
    try:
        h = hashlib.sha256()
        with gzip.open(path, "rb") as stream:
            while chunk := stream.read(8 * MB):
                h.update(chunk)
        return h.hexdigest()
    except (OSError, EOFError):
        return "of no gzip stream"


def fetch(uri: str, cache_dir: str | os.PathLike) -> Path:
    """The bundle at ``uri`` in the local cache, the SHA-256 of its tar stream checked against its name at every
    use: a cached copy that another job changed is downloaded again, never run."""
    base, _, name = uri.rpartition("/" + PREFIX)
    sha = name.removesuffix(".tar.gz")
    path = Path(cache_dir) / name
    if path.is_file() and not path.is_symlink() and _digest(path) == sha:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.unlink(missing_ok=True)
    open_store(base + "/").download_file(PREFIX + name, tmp)
    digest = _digest(tmp)
    if digest != sha:
        tmp.unlink()
        raise ValueError(f"code bundle {uri}: its content has SHA-256 {digest}, not the one it is named by")
    os.replace(tmp, path)
    return path


def unpack(archive: str | os.PathLike, dest: str | os.PathLike, max_bytes: int = MAX_BYTES) -> Path:
    """A fresh copy of the bundle's files in ``dest`` (what an earlier attempt left there is removed). The limit
    submit holds a bundle to is held here too, from the archive's headers before a byte is written: a small
    archive of a huge file would otherwise fill the node's disk."""
    with tarfile.open(archive, "r:gz") as tar:
        members = tar.getmembers()
        for m in members:  # what pack writes: regular files below the bundle's root, nothing else
            parts = PurePosixPath(m.name).parts
            if not (m.isfile() or m.isdir()) or not parts or m.name.startswith("/") or ".." in parts:
                raise ValueError(f"code bundle {Path(archive).name}: member {m.name!r} is not a file below its root")
        size = sum(m.size for m in members if m.isfile())
        if size > max_bytes:
            raise ValueError(f"code bundle {Path(archive).name}: its files are {size / MB:.1f} MB unpacked, over the "
                             f"bundle limit of {max_bytes / MB:.0f} MB")
        dest = Path(dest)
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        # and Python's own data filter where it has one (3.11.4 and later; Debian 12's 3.11.2 has not)
        tar.extractall(dest, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return dest
