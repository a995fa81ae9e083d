"""Tenants in the simulator (`terra-sim --tenants`, docs/design.md section 4.5): who owns
which coflow, the greedy tenant's split coflows, and per-tenant statistics.

Assignment rule: the workload's coflows, in workload order (after --limit), go to the
tenants in turn: coflow i to tenant i mod N (tenants in the order given). `--tenants N`
names them t0..t{N-1} with weight 1; `--tenants FILE` reads a JSON object
{name: weight} (weights > 0, in that order), or a FILE.toml in the controller's tenants file
format (terra_controller/tenants_config.py): its weights and its guaranteed reservations
(windows in simulated seconds), admitted on the topology before the run
(terra_core/reservations.py; refused: an error naming the failure that does not fit).

The greedy tenant (--greedy-tenant NAME) replays each of its coflows as PIECES small ones
with the same arrival: every flow is cut into PIECES equal parts, part j in piece j (ids
"<coflow id>/j"). Its per-tenant figures count each original coflow once, ended when its
last piece ends.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np

from terra_core.tenant_policy import TenantSpec
from terra_core.tenant_shares import DEFAULT_ORDER
from terra_model import Coflow, Flow
from terra_security.pki import NAME_RE  # the tenant name rule of the controller

PIECES = 100  # coflows a greedy tenant makes of each of its own
SPLIT = "/"  # between a greedy tenant's coflow id and its piece number


def parse_tenants(value: str) -> dict[str, float]:
    """`--tenants` value -> {name: weight}: a positive integer N (t0..t{N-1}, weight 1) or
    the path of a JSON file {name: weight}: names as in the controller's tenants file
    (1-64 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit, unique
    ignoring case; terra_security.pki.NAME_RE), each key once, weights finite numbers > 0.

    Raises:
        ValueError: an integer N < 1, a file that is not such a JSON object.
        OSError: the file cannot be read.
    """
    if _INTEGER.fullmatch(value.strip()):
        n = int(value)
        if n < 1:
            raise ValueError(f"--tenants must be >= 1, got {n}")
        return {f"t{i}": 1.0 for i in range(n)}
    try:
        raw = json.loads(Path(value).read_text(), object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--tenants {value}: not JSON ({exc})") from None
    except _DuplicateKey as exc:
        raise ValueError(f"--tenants {value}: tenant {exc.args[0]!r} is given twice") from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"--tenants {value}: expected a JSON object {{name: weight}}")
    seen: dict[str, str] = {}
    for name, w in raw.items():
        if not NAME_RE.fullmatch(name):
            raise ValueError(
                f"--tenants {value}: bad tenant name {name!r:.70}: "
                "1-64 characters of A-Z a-z 0-9 . _ -"
            )
        if name.lower() in seen:
            raise ValueError(
                f"--tenants {value}: duplicate tenant {name!r} (as {seen[name.lower()]!r})"
            )
        seen[name.lower()] = name
        if isinstance(w, bool) or not isinstance(w, int | float) or not 0 < w < math.inf:
            raise ValueError(
                f"--tenants {value}: tenant {name!r} weight must be a finite number > 0, "
                f"got {w!r:.70}"
            )
    return {str(k): float(v) for k, v in raw.items()}


_INTEGER = re.compile(r"[+-]?[0-9]+")


class _DuplicateKey(Exception):
    """A JSON object names a key twice (the key)."""


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """json object_pairs_hook: the object as a dict, refusing a key given twice."""
    out: dict[str, object] = {}
    for key, val in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = val
    return out


def tenant_weights(value: str, topology, k: int) -> tuple[dict[str, float], list]:
    """`--tenants` value -> ({name: weight}, [terra_core Reservation]): parse_tenants, or a
    .toml tenants file with its reservations admitted on `topology` with `k` tunnels.

    Raises:
        ValueError (TenantsError): a bad file or reservations that do not fit (one line).
        OSError: the file cannot be read.
    """
    if not value.endswith(".toml"):
        return parse_tenants(value), []
    from terra_controller.reservations import admit, core_reservations
    from terra_controller.tenants_config import TenantsError
    from terra_controller.tenants_config import parse_tenants as parse_file

    config = parse_file(Path(value).read_text(encoding="utf-8"), value)
    try:
        admit(config.tenants, topology, k)
    except TenantsError as exc:
        raise TenantsError(f"{value}: {exc}") from None
    weights = {name: lim.weight for name, lim in config.tenants.items()}
    return weights, core_reservations(config.tenants)


def assign(coflows: list[Coflow], weights: dict[str, float]) -> dict[str, str]:
    """{coflow id: tenant}: coflow i (workload order) to the (i mod N)-th tenant."""
    names = list(weights)
    return {c.id: names[i % len(names)] for i, c in enumerate(coflows)}


def split_greedy(
    coflows: list[Coflow], tenant_of: dict[str, str], greedy: str, pieces: int = PIECES
) -> tuple[list[Coflow], dict[str, str]]:
    """Replace each coflow of tenant `greedy` by `pieces` coflows (module docstring).

    Returns:
        (the new workload in the same order, {coflow id: tenant} for it).

    Raises:
        ValueError: `greedy` owns no coflow, or pieces < 1.
    """
    if pieces < 1:
        raise ValueError(f"pieces must be >= 1, got {pieces}")
    if greedy not in tenant_of.values():
        raise ValueError(f"--greedy-tenant {greedy!r}: no such tenant with coflows")
    out: list[Coflow] = []
    owner: dict[str, str] = {}
    for c in coflows:
        if tenant_of[c.id] != greedy:
            out.append(c)
            owner[c.id] = tenant_of[c.id]
            continue
        for j in range(pieces):
            flows = [Flow(f.id, f.src, f.dst, f.bytes / pieces) for f in c.flows]
            piece = replace(c, id=f"{c.id}{SPLIT}{j}", flows=flows)
            out.append(piece)
            owner[piece.id] = greedy
    return out, owner


def per_tenant(result, tenant_of: dict[str, str], greedy: str | None = None) -> dict:
    """{tenant: {"avg_cct_s", "coflows"}} over the finished, admitted WAN coflows of
    `result` (a SimResult), the greedy tenant's pieces joined back (module docstring;
    an original coflow counts only when all its pieces finished)."""
    ends: dict[str, list] = {}
    for c in result.coflows:
        if not c.wan:
            continue
        tenant = tenant_of[c.id]
        key = c.id.rsplit(SPLIT, 1)[0] if tenant == greedy else c.id
        entry = ends.setdefault(key, [tenant, c.arrival_s, 0.0, True])
        ok = c.admitted and c.finish_s is not None
        entry[3] = entry[3] and ok
        if ok:
            entry[2] = max(entry[2], c.finish_s)
    ccts: dict[str, list[float]] = {t: [] for t in dict.fromkeys(tenant_of.values())}
    for tenant, arrival, end, ok in ends.values():
        if ok:
            ccts[tenant].append(end - arrival)
    return {
        t: {"avg_cct_s": float(np.mean(v)) if v else None, "coflows": len(v)}
        for t, v in ccts.items()
    }


def tenant_spec(
    coflows: list[Coflow],
    weights: dict[str, float],
    greedy: str | None,
    sharing: str,
    reservations: list | tuple = (),
    pieces: int = PIECES,
    order: str = DEFAULT_ORDER,
) -> tuple[list[Coflow], TenantSpec]:
    """The workload to run and its TenantSpec (sharing and `order` as TenantSpec's):
    `assign`, then `split_greedy` (each of `greedy`'s coflows in `pieces`) when `greedy`.

    Raises:
        ValueError: as split_greedy and TenantSpec.
    """
    owner = assign(coflows, weights)
    if greedy is not None:
        coflows, owner = split_greedy(coflows, owner, greedy, pieces)
    return coflows, TenantSpec(dict(weights), owner, sharing, tuple(reservations), order)
