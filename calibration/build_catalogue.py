"""Build pipesim's derived tables of every GPU AIConfigurator measured (the shipped catalogue).

    python calibration/build_catalogue.py [--source .../aiconfigurator_core/systems/data]

For every system (GPU) of aiconfigurator-core (Apache-2.0) with measured data, every
engine pipesim models (SGLang, vLLM) and every engine version that measured a kernel,
the tables pipesim reads are derived by pipesim.profiles.importers.aiconfigurator
(`build_tables`, as `pipesim[catalogue]` builds them at run time) and written compactly
by pipesim.profiles.derived into calibration/catalogue/<system>/ (installed as
pipesim.data.catalogue). Nothing is edited by hand; rerunning the script on the same
aiconfigurator-core reproduces the files byte for byte. Needs aiconfigurator-core
(`pip install -e '.[test]'` or `'.[catalogue]'`). Prints each profile's tables and the
size of each system's folder.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from pipesim.base.errors import UserError
from pipesim.profiles.catalogue import data_root, installed_version
from pipesim.profiles.derived import profile_key, write_system
from pipesim.profiles.importers.aiconfigurator import KERNEL_SETS, build_tables
from pipesim.profiles.importers.aiconfigurator_layout import is_nested, version_key

HERE = Path(__file__).resolve().parent
KERNEL_OPS = ("gemm", "moe", "attention", "mla")  # the op folders of the kernel tables pipesim reads
KERNELS = ("gemm", "gqa_decode", "mla_decode")  # a profile without one of these times no kernel
NOTICE = """# pipesim's derived AIConfigurator tables

Every file below this folder is derived from the measured silicon data of NVIDIA's
AIConfigurator (github.com/ai-dynamo/aiconfigurator), as its `aiconfigurator-core` {version}
package ships it (`aiconfigurator_core/systems/data/`), Copyright (c) 2025-2026 NVIDIA
CORPORATION & AFFILIATES, licensed under the Apache License, Version 2.0
(http://www.apache.org/licenses/LICENSE-2.0).

Changes made (pipesim/profiles/importers/aiconfigurator.py): only the rows pipesim reads
are kept (the kernels each engine runs by default, bf16 activations and KV cache, NCCL in
half precision), columns renamed to pipesim's, message sizes turned into bytes, repeated
measurements averaged, latencies rounded to 6 significant digits, and the tables stored as
numpy columns (pipesim/profiles/derived.py). Written by `python calibration/build_catalogue.py`;
each system's index.json says which engine version every table was measured with.
"""


def kernel_versions(system_dir: Path, engine: str) -> list[str]:
    """Every version of `engine` that measured one of the kernel tables pipesim reads."""
    found = {p.name for op in KERNEL_OPS for p in (system_dir / op / engine).glob("*") if p.is_dir()}
    return sorted(found, key=version_key)


def system_profiles(system_dir: Path) -> dict:
    """index key -> (tables, table -> version read): each engine at its newest tables, and
    at every version that measured a kernel (as --engine-version reads it)."""
    out = {}
    for engine in KERNEL_SETS:
        for version in [None, *kernel_versions(system_dir, engine)]:
            read: dict = {}
            try:
                tables = build_tables(system_dir, kernel_set=engine, version=version, versions=read)
            except UserError as exc:
                print(f"  {system_dir.name} {profile_key(engine, version)}: left out ({exc})")
                continue
            if not any(t in tables for t in KERNELS):
                continue
            out[profile_key(engine, version)] = (tables, read)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=None, help="aiconfigurator_core/systems/data")
    ap.add_argument("--out", type=Path, default=HERE / "catalogue")
    args = ap.parse_args()
    source = args.source or data_root()
    version = installed_version()
    if source is None or version is None:
        raise SystemExit("needs aiconfigurator-core installed: pip install -e '.[catalogue]'")
    systems = sorted(p for p in source.iterdir() if p.is_dir() and is_nested(p))
    total, kept = 0, set()
    for system_dir in systems:
        t0 = time.perf_counter()
        profiles = system_profiles(system_dir)
        if not profiles:
            continue
        meta = {
            "aiconfigurator_core": version,
            "source": f"aiconfigurator-core {version} (github.com/ai-dynamo/aiconfigurator), "
            f"systems/data/{system_dir.name}",
            "licence": "Apache-2.0, Copyright (c) 2025-2026 NVIDIA CORPORATION & AFFILIATES (see README.md)",
            "derived_by": "pipesim.profiles.importers.aiconfigurator, written by calibration/build_catalogue.py",
        }
        size = write_system(args.out / system_dir.name, system_dir.name, meta, profiles)
        total += size
        kept.add(system_dir.name)
        print(f"{system_dir.name}: {size / 1e6:.2f} MB in {time.perf_counter() - t0:.1f} s")
        for key, (tables, _) in profiles.items():
            print(f"  {key}: " + ", ".join(f"{t} {len(df):,}" for t, df in tables.items()))
    for stale in args.out.iterdir():
        if stale.is_dir() and stale.name not in kept and (stale / "index.json").is_file():
            shutil.rmtree(stale)
    (args.out / "README.md").write_text(NOTICE.format(version=version))
    (args.out / "__init__.py").touch()
    print(f"catalogue: {total / 1e6:.1f} MB in {args.out}")


if __name__ == "__main__":
    main()
