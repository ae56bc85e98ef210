"""A manifest as it was at a git revision: `git:REV[:PATH]`, read with git into a temporary folder.

The working tree is never touched. The temporary folder mirrors the absolute paths of the files it holds
(`/work/repo/m.yaml` is `TMP/work/repo/m.yaml`), so every relative path a manifest writes resolves there as
it does in the repository, `../` out of it included. It holds exactly the files the manifest needs at that
revision: the manifest, its `include:` files, and what its PATH_FIELDS name (chat template, suite datasets,
calibration suite, fallback manifest, parent manifest, weights), each manifest among them followed in turn.

A named path that the revision lacks, but the working tree holds untracked or ignored (a built checkpoint),
is linked from the working tree; one outside the repository is linked where it is. Both are recorded, so the
report says which files did not come from the revision.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from servegate.contracts.errors import ManifestError, ServegateError
from servegate.contracts.loading import PATH_FIELDS, Located, Path_, read_located

GIT_PREFIX = "git:"
"""A manifest argument that starts with this names a revision: `git:REV` or `git:REV:PATH`."""

_MANIFEST_FIELDS = (("failure_policy", "fallback", "manifest"), ("weights", "derived_from"))
"""Path fields whose file is itself a manifest (derived_from only when it names a .yaml/.yml/.json)."""


@dataclass(frozen=True)
class GitBaseline:
    """Where a manifest read from git came from: the revision and every file read, as the report records it."""

    spec: str
    """The argument as given, e.g. `git:origin/main`."""
    revision: str
    """The revision as given, e.g. `origin/main`."""
    commit: str
    """The full sha of the commit the revision named when it was read."""
    path: str
    """The manifest's path relative to the repository root."""
    blobs: dict[str, str]
    """Repository-relative path -> git blob sha, for every file read from the commit."""
    working_tree: list[str] = field(default_factory=list)
    """Named paths absent at the commit but untracked or ignored in the working tree (built weights), read there."""
    outside_repository: list[str] = field(default_factory=list)
    """Named paths outside the repository, read where they are (absolute)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form written in reports."""
        return asdict(self)

    def summary(self) -> str:
        """One line for the table and the notes."""
        extra = f"; from the working tree: {', '.join(self.working_tree)}" if self.working_tree else ""
        return f"{self.path} read from git {self.revision} (commit {self.commit}, {len(self.blobs)} file(s)){extra}"


def is_git_spec(argument: str | Path | None) -> bool:
    """Whether a manifest argument names a git revision (`git:REV[:PATH]`) rather than a file."""
    return argument is not None and str(argument).startswith(GIT_PREFIX)


def _split(spec: str) -> tuple[str, str | None]:
    rest = spec.removeprefix(GIT_PREFIX)
    revision, _, path = rest.partition(":")
    if not revision:
        raise ServegateError(f"{spec}: name a revision, e.g. git:origin/main or git:HEAD~1:path/to/manifest.yaml")
    return revision, path or None


class _Git:
    """git commands in one repository, each failure turned into one line naming the argument."""

    def __init__(self, spec: str, folder: Path) -> None:
        self.spec = spec
        if shutil.which("git") is None:
            raise ServegateError(f"{spec}: git is not installed (not on PATH): install git, or give a manifest file")
        try:
            top = self._run(["rev-parse", "--show-toplevel"], folder).strip()
        except subprocess.CalledProcessError:
            raise ServegateError(f"{spec}: {folder} is not in a git repository: give a manifest file instead") from None
        self.root = Path(top).resolve()

    def _run(self, args: list[str], folder: Path | None = None) -> str:
        completed = subprocess.run(
            ["git", "-C", str(folder or self.root), *args], capture_output=True, check=True, text=True
        )
        return completed.stdout

    def bytes(self, args: list[str]) -> bytes:
        """The raw output of a git command (blob contents)."""
        return subprocess.run(["git", "-C", str(self.root), *args], capture_output=True, check=True).stdout

    def commit(self, revision: str) -> str:
        """The full sha `revision` names; a one-line error when this clone does not have it."""
        try:
            return self._run(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{revision}^{{commit}}"]).strip()
        except subprocess.CalledProcessError:
            pass
        if self._run(["rev-parse", "--is-shallow-repository"]).strip() == "true":
            branch = revision.removeprefix("origin/")
            fetch = "" if re.search(r"[~^@:]", revision) else f"git fetch origin {branch}, or "
            raise ServegateError(
                f"{self.spec}: this shallow clone lacks revision {revision!r}: fetch it with {fetch}git fetch "
                "--unshallow for the whole history (in CI: check out with fetch-depth: 0)"
            )
        raise ServegateError(
            f"{self.spec}: unknown revision {revision!r} in {self.root} (a remote branch must be fetched first: "
            f"git fetch origin <branch>)"
        )

    def kind(self, commit: str, rel: str) -> str | None:
        """`blob` or `tree` for a path at the commit; None when the commit has no such path."""
        try:
            return self._run(["cat-file", "-t", f"{commit}:{rel}"]).strip()
        except subprocess.CalledProcessError:
            return None

    def blobs_under(self, commit: str, rel: str) -> dict[str, str]:
        """Repository-relative path -> blob sha of every file at `rel` (a file or a folder) in the commit."""
        out = self._run(["ls-tree", "-r", "-z", "--full-tree", commit, "--", rel])
        blobs: dict[str, str] = {}
        for entry in filter(None, out.split("\0")):
            meta, name = entry.split("\t", 1)
            _, kind, sha = meta.split()
            if kind == "blob":
                blobs[name] = sha
        return blobs

    def tracked(self, rel: str) -> bool:
        """Whether the index tracks `rel` or anything under it."""
        return bool(self._run(["ls-files", "--", rel]).strip())

    def commit_time(self, commit: str) -> int:
        """The commit's time (seconds since the epoch)."""
        return int(self._run(["show", "-s", "--format=%ct", commit]).strip())


class _Mirror:
    """The temporary folder that holds a manifest's files as they were at one commit."""

    def __init__(self, git: _Git, commit: str, into: Path) -> None:
        self.git, self.commit, self.into = git, commit, into
        self.blobs: dict[str, str] = {}
        self.working_tree: list[str] = []
        self.outside: list[str] = []
        self._manifests: set[str] = set()
        self._time = git.commit_time(commit)

    def local(self, real: Path) -> Path:
        """Where a real absolute path lies inside the mirror."""
        return self.into / real.relative_to(real.anchor)

    def real(self, local: Path) -> Path:
        """The real path a path inside the mirror stands for."""
        return Path("/") / local.relative_to(self.into)

    def rel(self, real: Path) -> str | None:
        """`real`'s path relative to the repository root, or None when it lies outside."""
        try:
            return real.relative_to(self.git.root).as_posix()
        except ValueError:
            return None

    def _write(self, rel: str, sha: str) -> None:
        target = self.local(self.git.root / rel)
        if target.exists() or target.is_symlink():
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(self.git.bytes(["cat-file", "blob", sha]))
        os.utime(target, (self._time, self._time))  # stable mtimes: the output cache stamps weight files by them
        self.blobs[rel] = sha

    def _link(self, real: Path) -> None:
        target = self.local(real)
        if target.exists() or target.is_symlink():
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(real, target_is_directory=real.is_dir())

    def path(self, real: Path) -> bool:
        """Bring one named path into the mirror; True when it came from the commit."""
        real = Path(os.path.normpath(real))
        rel = self.rel(real)
        if rel is None:
            if real.exists() and str(real) not in self.outside:
                self._link(real)
                self.outside.append(str(real))
            return False
        kind = self.git.kind(self.commit, rel)
        if kind in ("blob", "tree"):
            for name, sha in self.git.blobs_under(self.commit, rel).items():
                self._write(name, sha)
            return kind == "blob"
        if real.exists() and rel not in self.working_tree and not self.git.tracked(rel):  # built, never committed
            self._link(real)
            self.working_tree.append(rel)
        return False  # absent at the commit: loading it says so, as it would for a working-tree manifest

    def manifest(self, rel: str) -> None:
        """A manifest file at the commit and every file it includes or names."""
        if rel in self._manifests:
            return
        self._manifests.add(rel)
        self._includes(rel, set())
        try:
            located = read_located(self.local(self.git.root / rel))
        except ServegateError:
            return  # a manifest that does not load: loading it again reports where
        for pattern in PATH_FIELDS:
            for field_path, value, folder in _written_paths(located, pattern):
                named = self.real(folder) / value
                from_commit = self.path(named)
                if from_commit and _names_manifest(field_path, value):
                    named_rel = self.rel(Path(os.path.normpath(named)))
                    if named_rel is not None:
                        self.manifest(named_rel)

    def _includes(self, rel: str, seen: set[str]) -> None:
        if rel in seen or not self.path(self.git.root / rel):
            return
        seen.add(rel)
        try:
            data = YAML(typ="safe").load(self.local(self.git.root / rel).read_text(encoding="utf-8"))
        except Exception:  # not YAML or not text: read_located reports it with its position
            return
        include = data.get("include") if isinstance(data, dict) else None
        for name in [include] if isinstance(include, str) else include if isinstance(include, list) else []:
            if isinstance(name, str) and name and "\0" not in name and not os.path.isabs(name):
                named = self.rel(Path(os.path.normpath(self.git.root / posixpath.dirname(rel) / name)))
                if named is not None:
                    self._includes(named, seen)


def _written_paths(located: Located, pattern: Path_) -> Iterator[tuple[Path_, str, Path]]:
    """(field path, relative path as written, folder of the file that wrote it) for each field matching pattern."""

    def walk(data: Any, rest: Path_, at: Path_) -> Iterator[tuple[Path_, Any]]:
        if not rest:
            yield at, data
        elif rest[0] is int and isinstance(data, list):
            for i, item in enumerate(data):
                yield from walk(item, rest[1:], (*at, i))
        elif isinstance(data, dict) and rest[0] in data:
            yield from walk(data[rest[0]], rest[1:], (*at, rest[0]))

    for field_path, value in walk(located.data, pattern, ()):
        position = located.positions.get(field_path)
        folder = located.folders.get(position[0]) if position is not None else None
        if isinstance(value, str) and value and "\0" not in value and folder is not None and _relative(value):
            yield field_path, value, folder


def _relative(value: str) -> bool:
    """A relative file path: not absolute, and no scheme (`zoo:arith`, `hf:org/name`, `lm-eval:task`)."""
    head = value.split("/", 1)[0]
    return not Path(value).expanduser().is_absolute() and ":" not in head


def _names_manifest(field_path: Path_, value: str) -> bool:
    return field_path in _MANIFEST_FIELDS and value.lower().endswith((".yaml", ".yml", ".json"))


@contextmanager
def manifest_from_git(spec: str, default_path: Path | None = None) -> Iterator[tuple[Path, GitBaseline]]:
    """The manifest `git:REV[:PATH]` names, read into a temporary folder kept until the block ends.

    PATH is relative to the repository root; without it, `default_path` (a file in the working tree, e.g.
    the candidate) is used at the revision. Yields the manifest file to load and what was read; a
    ServegateError raised in the block names the files as `REV:PATH`, not by their temporary paths.
    """
    revision, path = _split(spec)
    folder = default_path.resolve().parent if default_path is not None and path is None else Path.cwd()
    git = _Git(spec, folder)
    commit = git.commit(revision)
    rel = _manifest_rel(spec, git, path, default_path)
    kind = git.kind(commit, rel)
    if kind != "blob":
        what = "a folder" if kind == "tree" else "absent"
        raise ServegateError(f"{spec}: {rel} is {what} at {revision} (commit {commit[:12]}): give git:REV:PATH")
    into = Path(tempfile.mkdtemp(prefix="servegate-git-")).resolve()
    try:
        mirror = _Mirror(git, commit, into)
        mirror.manifest(rel)
        baseline = GitBaseline(
            spec=spec,
            revision=revision,
            commit=commit,
            path=rel,
            blobs=dict(sorted(mirror.blobs.items())),
            working_tree=mirror.working_tree,
            outside_repository=mirror.outside,
        )
        try:
            yield mirror.local(git.root / rel), baseline
        except ServegateError as exc:
            _rename_paths(exc, {str(mirror.local(git.root)) + os.sep: f"{revision}:", str(into): ""})
            raise
    finally:
        shutil.rmtree(into, ignore_errors=True)


def _manifest_rel(spec: str, git: _Git, path: str | None, default_path: Path | None) -> str:
    if path is None:
        if default_path is None:
            raise ServegateError(f"{spec}: name the manifest's path in the repository: git:REV:PATH")
        resolved = default_path.resolve()
        if not resolved.is_relative_to(git.root):
            raise ServegateError(f"{spec}: {default_path} is outside the repository {git.root}: give git:REV:PATH")
        path = resolved.relative_to(git.root).as_posix()
    rel = posixpath.normpath(path.removeprefix("/"))
    if rel.startswith("../") or rel in ("..", "."):
        raise ServegateError(f"{spec}: PATH is relative to the repository root {git.root} and stays inside it")
    return rel


def _rename_paths(exc: ServegateError, names: dict[str, str]) -> None:
    """Name mirrored files in an error as git does (`REV:path`; others by their real path), not by the temporary
    folder."""

    def rename(text: str) -> str:
        for temporary, name in names.items():
            text = text.replace(temporary, name)
        return text

    exc.args = tuple(rename(a) if isinstance(a, str) else a for a in exc.args)
    if isinstance(exc, ManifestError):
        exc.problems = [rename(p) for p in exc.problems]
