"""One way in for every source of a model's files: a hub-cache snapshot, a plain folder, or a repo on the Hub.

The readers of what the bytes *mean* (config files, safetensors headers, the dtype census, the rules)
only ever see a ModelSource, so they run unchanged wherever the bytes come from; where they come from
is this module's business (huggingface_hub's split between file_download.py and utils/ is the model).
The Hub's implementation is gemma_doctor/hub.py, imported only when a model is read from the Hub.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Protocol, Sequence

from gemma_doctor import fsafe
from gemma_doctor.readers.jsonfile import JsonFile, read_json_file
from gemma_doctor.readers.safetensors_header import SafetensorsHeader, read_header


class ModelSource(Protocol):
    """Where one model's files are read from."""

    kind: str  # "cache" | "folder" | "hub"

    def has(self, name: str) -> bool:
        """True when the model has a file called ``name`` (a dangling or escaping link counts: it is reported)."""

    def read_json(self, name: str) -> JsonFile:
        """A small JSON file (config.json, generation_config.json, tokenizer_config.json...), bounded and strict."""

    def read_header(self, name: str) -> SafetensorsHeader:
        """The validated header of a safetensors file (never its tensor data)."""

    def read_headers(self, names: Sequence[str]) -> list[SafetensorsHeader]:
        """The headers of several files, in order (a remote source reads them in parallel)."""

    @property
    def location(self) -> str:
        """Where the files are, for people: a folder, or the Hub URL of the commit read."""

    def local_path(self, name: str) -> Path | None:
        """The file on this machine, for readers that need its bytes (the weights scan); None when remote."""


def _entry_name(name: str) -> bool:
    """A name a folder's listing can hold: not "", "." or ".." (a listing never has them, a lookup finds the folder
    itself or its parent: an index may name a shard "."), no "/" (below the folder)."""
    return "/" not in name and name not in ("", ".", "..")


@dataclass(frozen=True)
class LocalSource:
    """A folder on this machine; with ``root``, a link resolving outside it is never read."""

    folder: Path
    root: Path | None = None
    kind: str = "folder"

    def has(self, name: str) -> bool:
        """True when the folder has ``name`` (as a file, a folder or a link, dangling or not)."""
        names = self._names if _entry_name(name) else None
        if names is not None:
            return name in names
        return os.path.lexists(self.folder / name)

    @cached_property
    def _names(self) -> frozenset[str] | None:
        """The folder's entries, listed once at the first question (a model's files are asked about a dozen times:
        one listing instead of a dozen lookups); None where the folder cannot be listed (each name is then looked
        up). A name is only ever a hint: every file is still opened at the moment of use, as fsafe opens it."""
        try:
            if not os.access(self.folder, os.X_OK):  # listed but not entered (r without x): every lookup fails
                return None
            return frozenset(os.listdir(self.folder))
        except (OSError, ValueError):
            return None

    @cached_property
    def _area(self) -> fsafe.Area | None:
        """The repo folder as an fsafe.Area, made once for all of this model's reads."""
        return fsafe.Area(self.root) if self.root is not None else None

    @cached_property
    def _folder_parts(self) -> list[str] | None:
        """The folder's components below the repo folder (``snapshots/<commit>``), worked out once per model; None
        without a repo folder, or where the folder is not below it (fsafe then says so, as it always did)."""
        area = self._area
        if area is None:
            return None
        try:
            return area.parts(self.folder)
        except fsafe.Refused:
            return None

    def holding(self) -> _Holding:
        """``with source.holding():`` the block's reads of this model's files walk from folders held open once
        (fsafe.Area.holding: the repo folder, the snapshot folder, blobs/), not from the repo folder's path at every
        read; closed when the block ends, after which reads walk as before."""
        return _Holding(self)

    def _parts_of(self, name: str) -> list[str] | None:
        """fsafe's components of the file ``name`` below the repo folder, for a plain name (None: fsafe works them
        out of the path, as for any other)."""
        folder = self._folder_parts if _entry_name(name) else None
        return None if folder is None else [*folder, name]

    def read_json(self, name: str) -> JsonFile:
        """read_json_file confined to the repo folder (a name missing from the folder's listing, when has() made one,
        is missing, unread: config.json alone, all a whole-cache scan reads of most repos, lists nothing)."""
        names = self.__dict__.get("_names") if _entry_name(name) else None  # only a listing has() made
        if names is not None and name not in names:
            return JsonFile(self.folder / name, exists=False)
        return read_json_file(self.folder / name, self.root, self._area, parts=self._parts_of(name))

    def read_header(self, name: str) -> SafetensorsHeader:
        """The header of ``name``; a link leading outside the repo folder is refused unread (at the moment of use)."""
        return read_header(self.folder / name, self.root, self._area)

    def read_headers(self, names: Sequence[str]) -> list[SafetensorsHeader]:
        """One after the other: local reads are fast, and the weights scan parallelises the heavy part."""
        return [self.read_header(n) for n in names]

    @property
    def location(self) -> str:
        """The folder."""
        return str(self.folder)

    def local_path(self, name: str) -> Path | None:
        """The file itself."""
        return self.folder / name


class _Holding:
    """LocalSource.holding's context: the source reads through its area's held folders inside it."""

    __slots__ = ("source", "plain", "held")

    def __init__(self, source: LocalSource) -> None:
        self.source, self.plain, self.held = source, source._area, None

    def __enter__(self) -> None:
        if self.plain is not None:
            self.held = self.plain.holding()
            # the cached property's own slot, where functools.cached_property keeps its value
            self.source.__dict__["_area"] = self.held.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self.held is not None:
            self.source.__dict__["_area"] = self.plain
            self.held.__exit__(*exc)


def local(folder: Path, root: Path | None) -> LocalSource:
    """The source of a snapshot folder (``root`` = its repo folder) or of a plain folder (root None)."""
    return LocalSource(folder, root, "cache" if root is not None else "folder")
