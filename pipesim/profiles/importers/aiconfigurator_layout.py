"""Where the tables of one AIConfigurator system folder are, in either of its layouts.

Two layouts are read. The flat one (the raw tables kept beside the project): one
system folder of ``<table>.csv.gz`` (SGLang kernels and NCCL) with a ``vllm-<version>/``
subfolder. The nested one, as the ``aiconfigurator-core`` package ships it:
``<system>/<op>/<engine>/<version>/<table>.parquet`` with a ``collection_meta.yaml``
naming the framework and version. There each table is read at the newest version of
the engine that measured it (or the one asked for), NCCL at its newest, and
`Layout.versions` says which version every table came from. Kernel names changed
between engine versions, so each derived dtype has a list of kernels in order of
preference (the engine's default first) and the first one present is used.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from ...base.errors import UserError, require

if TYPE_CHECKING:  # pandas only where a table is read: the catalogue orders versions without it
    import pandas as pd

# Nested layout: the <op> folder of each table.
OP_FOLDERS = {
    "gemm_perf": "gemm",
    "moe_perf": "moe",
    "generation_attention_perf": "attention",
    "context_attention_perf": "attention",
    "generation_mla_perf": "mla",
    "context_mla_perf": "mla",
    "custom_allreduce_perf": "comm",
    "nccl_perf": "comm",
}


class NotMeasured(UserError):
    """A table the nested layout does not hold (at the version asked for): that table is
    left out. Anything else wrong with a folder (a version its meta contradicts) is an
    error, not a table to skip."""


def version_key(version: str) -> tuple:
    """Order engine versions: 0.5.10 after 0.5.9, 1.3.0rc20 after 1.3.0rc3."""
    return tuple(int(n) for n in re.findall(r"\d+", version))


def is_nested(system_dir: Path) -> bool:
    return any((Path(system_dir) / op).is_dir() for op in set(OP_FOLDERS.values()))


class Layout:
    """Where each table of one system is, for one engine; `read(stem)` records the
    version it read in `versions` (stem -> "engine version")."""

    def __init__(
        self, system_dir: Path, engine: str, version: str | None = None, flat_kernels: Path | None = None
    ):
        self.dir, self.engine, self.version = Path(system_dir), engine, version
        self.flat_kernels = flat_kernels  # flat layout: the folder of the engine's kernel tables
        self.nested = flat_kernels is None
        self.versions: dict[str, str] = {}

    def _nested_folder(self, stem: str) -> Path:
        engine = "nccl" if stem == "nccl_perf" else self.engine
        base = self.dir / OP_FOLDERS[stem] / engine
        found = (
            sorted((p.name for p in base.glob("*") if (p / f"{stem}.parquet").is_file()), key=version_key)
            if base.is_dir()
            else []
        )
        if not found:
            raise NotMeasured(
                f"{self.dir.name} has no {engine} measurement of {stem} (no {base}/<version>/{stem}.parquet)"
            )
        version = found[-1]
        if engine != "nccl" and self.version is not None:
            if self.version not in found:
                raise NotMeasured(
                    f"{self.dir.name}: {stem} was measured with {engine} {', '.join(found)}, "
                    f"not {self.version}; pick one of those with --engine-version"
                )
            version = self.version
        folder = base / version
        meta = folder / "collection_meta.yaml"
        if meta.is_file():  # framework and version as collected (a two-line read: no YAML dependency)
            text = meta.read_text()
            got = re.search(r"^\s*version:\s*['\"]?([^'\"\s]+)", text, re.M)
            if got and got.group(1) != version:
                raise UserError(f"{meta}: says version {got.group(1)}, but its folder is {version}")
        self.versions[stem] = f"{engine} {version}"
        return folder

    def read(self, stem: str) -> pd.DataFrame:
        """Read one AIConfigurator table; missing files are a user error, not a crash."""
        import pandas as pd

        if self.flat_kernels is None:  # nested
            path = self._nested_folder(stem) / f"{stem}.parquet"
            import pyarrow.parquet as pq

            from ...base.checks import MAX_TABLE_ROWS

            rows = pq.ParquetFile(path).metadata.num_rows  # the footer's count, before any row is read
            require(rows <= MAX_TABLE_ROWS, f"{path}: {rows:,} rows, above the limit of {MAX_TABLE_ROWS:,}")
            return pd.read_parquet(path)
        folder = self.dir if stem == "nccl_perf" else self.flat_kernels
        if folder.name.startswith("vllm-"):  # the flat layout names vLLM's version in its folder
            self.versions[stem] = f"vllm {folder.name[len('vllm-') :]}"
        path = folder / f"{stem}.csv.gz"
        if not path.is_file():
            raise UserError(f"missing AIConfigurator table {path}")
        import io

        from ...base.checks import MAX_TABLE_BYTES, MAX_TABLE_ROWS, read_bounded

        data = read_bounded(path, str(path), MAX_TABLE_BYTES, MAX_TABLE_ROWS)
        return pd.read_csv(io.BytesIO(data))
