"""DeepSpeed's hostfile and --include / --exclude resource filters (shared by `zerolite launch`
and the alias's `deepspeed.launcher.runner`).

Hostfile format (as DeepSpeed): one ``hostname slots=N`` per line; ``#`` starts a comment;
blank lines are ignored. ``--include`` / ``--exclude`` take ``host[:slot,slot...]`` entries
joined by ``@`` (``host`` alone = all its slots).
"""
from __future__ import annotations

import re


class LaunchError(Exception):
    """A user error in launcher flags or the hostfile: printed as one line, exit code 2."""


_HOST_LINE = re.compile(r"^(\S+)\s+slots\s*=\s*(\S+)$")


def parse_hostfile(text: str, source: str = "hostfile") -> dict[str, int]:
    """``{hostname: slots}`` in file order; errors name the file and line."""
    hosts: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{lineno}: {raw.strip()!r}"
        m = _HOST_LINE.match(line)
        if not m:
            raise LaunchError(f"{where}: expected 'hostname slots=N'")
        host, slots = m.group(1), m.group(2)
        if not slots.isdigit() or int(slots) < 1:
            raise LaunchError(f"{where}: slots must be a positive integer")
        if host in hosts:
            raise LaunchError(f"{where}: host {host!r} is listed twice")
        hosts[host] = int(slots)
    if not hosts:
        raise LaunchError(f"{source}: no 'hostname slots=N' lines found")
    return hosts


def read_hostfile(path: str) -> dict[str, int]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise LaunchError(f"--hostfile {path!r}: cannot read it ({e.strerror})") from None
    return parse_hostfile(text, path)


def parse_filter(spec: str, flag: str, pool: dict[str, list[int]]) -> dict[str, list[int] | None]:
    """``host[:s,s]@host...`` -> {host: slots or None (= all)}, checked against ``pool``."""
    out: dict[str, list[int] | None] = {}
    for entry in spec.split("@"):
        entry = entry.strip()
        host, sep, slot_text = entry.partition(":")
        if not host:
            raise LaunchError(f"{flag} {spec!r}: empty host name in entry {entry!r}")
        if host not in pool:
            raise LaunchError(f"{flag} {spec!r}: host {host!r} is not in the hostfile "
                              f"(hosts: {', '.join(pool)})")
        if host in out:
            raise LaunchError(f"{flag} {spec!r}: host {host!r} appears twice")
        if not sep:
            out[host] = None
            continue
        slots = []
        for s in slot_text.split(","):
            s = s.strip()
            if not s.isdigit():
                raise LaunchError(f"{flag} {spec!r}: slot {s!r} of host {host!r} is not a "
                                  "non-negative integer")
            if int(s) not in pool[host]:
                raise LaunchError(f"{flag} {spec!r}: host {host!r} has no slot {s} "
                                  f"(slots 0-{len(pool[host]) - 1})")
            if int(s) in slots:
                raise LaunchError(f"{flag} {spec!r}: slot {s} of host {host!r} appears twice")
            slots.append(int(s))
        out[host] = slots
    return out


def filter_pool(pool: dict[str, list[int]], include: str, exclude: str) -> dict[str, list[int]]:
    if include and exclude:
        raise LaunchError("--include and --exclude: pass only one of them")
    if include:
        inc = parse_filter(include, "--include", pool)
        return {h: (list(pool[h]) if s is None else sorted(s)) for h, s in inc.items()}
    if exclude:
        exc = parse_filter(exclude, "--exclude", pool)
        out = {}
        for h, slots in pool.items():
            if h in exc:
                if exc[h] is None:
                    continue
                slots = [s for s in slots if s not in exc[h]]
                if not slots:
                    continue
            out[h] = list(slots)
        if not out:
            raise LaunchError(f"--exclude {exclude!r}: excludes every host and slot")
        return out
    return {h: list(s) for h, s in pool.items()}
