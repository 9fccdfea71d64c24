"""The shipped tables one process has read: parsed once per file, validated once per op."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kdispatch.errors import short_error, warn_once
from kdispatch.opdef import Op, OpConfig
from kdispatch.paths import table_dirs, table_file
from kdispatch.tables import TableFile, load_for_op, read_table


class ShippedTables:
    """Looks a key up on an op's table search path (first current, valid entry wins); a
    missing or corrupt table degrades to the next one with one warning."""

    def __init__(self) -> None:
        self._files: dict[Path, TableFile | str] = {}  # parsed table, or why it is unusable
        self._entries: dict[tuple[Path, str], dict[str, Any]] = {}
        self._stale: dict[tuple[Path, str], set[str]] = {}
        self.status: dict[str, dict[str, str]] = {}  # device -> {file: status}

    def _file(self, path: Path, device_key: str) -> TableFile | str:
        got = self._files.get(path)
        if got is None:
            try:
                got = read_table(path)
                if got.device.key != device_key:
                    got = f"table is for device {got.device.key!r}, not {device_key!r}"
            except Exception as exc:  # noqa: BLE001 - a broken table never breaks serving
                got = f"table unusable: {short_error(exc)}"[:500]
            if isinstance(got, str):
                warn_once(f"table-error:{path}:{got}", f"kdispatch: {path}: {got}; skipped")
            self._files[path] = got
        return got

    def hit(self, spec: Op, device_key: str, kd: str) -> tuple[OpConfig | None, str]:
        """The first current, valid entry for ``kd`` on the op's table search path."""
        status = self.status.setdefault(device_key, {})
        outcomes = []
        for d in table_dirs(spec.table_dirs):
            path = table_file(d, device_key)
            if path is None:
                continue
            table = self._file(path, device_key)
            if isinstance(table, str):
                status[str(path)] = table
                outcomes.append(f"{path.name}: {table}")
                continue
            entries = self._entries.get((path, spec.name))
            if entries is None:
                entries, report = load_for_op(table, path, spec.name)
                self._entries[(path, spec.name)] = entries
                self._stale[(path, spec.name)] = report.stale_keys
                note = f"{spec.name}: {report.kept} entries"
                if report.stale:
                    note += f", {report.stale} stale"
                    warn_once(f"table-stale:{path}:{spec.name}",
                              f"kdispatch: {report.stale} {spec.name} entries of {path} were "
                              "tuned with other kernel sources; those keys use the next source")
                if report.rejected:
                    note += f", {len(report.rejected)} rejected"
                    warn_once(f"table-rejected:{path}:{spec.name}",
                              f"kdispatch: rejected {len(report.rejected)} invalid {spec.name} "
                              f"entries of {path}: {'; '.join(report.rejected[:3])}")
                status[str(path)] = "; ".join(filter(None, [status.get(str(path)), note]))
            hit = entries.get(kd)
            if hit is not None:  # "hit", after what the earlier tables on the path said
                return hit, "; ".join([*outcomes, f"hit in {path}"]) if outcomes else "hit"
            stale = kd in self._stale.get((path, spec.name), ())
            outcomes.append(f"{path.name}: " + ("entry is stale (kernel source changed)"
                                                if stale else "no entry for this key"))
        return None, "; ".join(outcomes) if outcomes else "no table"

    def summary(self) -> dict[str, str]:
        """device key -> what its tables held, for ``kdispatch.stats()``."""
        return {dev: "; ".join(f"{Path(p).name}: {st}" for p, st in files.items())
                or "no table" for dev, files in self.status.items()}
