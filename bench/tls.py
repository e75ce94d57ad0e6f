"""`make bench-tls`: what TLS and authentication cost recoverd's etcd calls (docs/security.md).

Three single-member etcds with stock flags (fsync on) run side by side on this host:

* ``plain``: plaintext, no authentication (what recoverd had before issue 13);
* ``tls``: TLS on the client port, ``--client-cert-auth``, a client certificate;
* ``tls+auth``: the same with authentication enabled, the certificate's common name as a
  per-job user whose role grants one job's prefix (etcd checks the permission on every request).

The same Store calls run against each in rounds that alternate the order (a noisy machine then
skews every configuration alike): a put, a get, a one-compare transaction (the shape of every
fenced write), and a new connection's first call (connect, TLS handshake, authentication). The
figures are per call, p50/p99 in milliseconds, with each configuration's ratio to ``plain``.

Writes bench/results/tls.json and bench/results/tls.md.
Usage: ``python bench/tls.py [--rounds 20 --calls 50]``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from recoverd.etcd_security import EtcdSecurity
from recoverd.etcd_server import EmbeddedEtcd, ServerTLS, find_etcdctl_binary
from recoverd.store import Put, Store, ValueIs

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
JOB_PREFIX = "/recoverd/v1/jobs/bench/"
CONFIGS = ("plain", "tls", "tls+auth")
OPS = ("put", "get", "txn", "connect")


def _certs(folder: Path) -> None:
    import trustme  # a dev dependency

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    server = ca.issue_cert("127.0.0.1")
    server.cert_chain_pems[0].write_to_path(str(folder / "server.pem"))
    server.private_key_pem.write_to_path(str(folder / "server-key.pem"))
    for name in ("root", "recoverd-agent-bench"):
        leaf = ca.issue_cert(f"{name}.example", common_name=name)
        leaf.cert_chain_pems[0].write_to_path(str(folder / f"{name}.pem"))
        leaf.private_key_pem.write_to_path(str(folder / f"{name}-key.pem"))


def _security(folder: Path, name: str) -> EtcdSecurity:
    return EtcdSecurity(
        cacert=str(folder / "ca.pem"), cert=str(folder / f"{name}.pem"), key=str(folder / f"{name}-key.pem")
    )


def _enable_auth(etcd: EmbeddedEtcd, folder: Path) -> None:
    etcdctl = find_etcdctl_binary(etcd.binary)
    assert etcdctl, "etcdctl ships beside etcd"
    base = [etcdctl, "--endpoints", etcd.url, "--cacert", str(folder / "ca.pem")]
    base += ["--cert", str(folder / "root.pem"), "--key", str(folder / "root-key.pem")]
    for argv in (
        ["user", "add", "root", "--no-password"],
        ["user", "grant-role", "root", "root"],
        ["role", "add", "bench"],
        ["role", "grant-permission", "bench", "readwrite", JOB_PREFIX, "--prefix=true"],
        ["user", "add", "recoverd-agent-bench", "--no-password"],
        ["user", "grant-role", "recoverd-agent-bench", "bench"],
        ["auth", "enable"],
    ):
        subprocess.run(base + argv, check=True, capture_output=True, timeout=30)


async def _round(endpoint: str, security: EtcdSecurity, calls: int, out: dict[str, list[float]]) -> None:
    key = f"{JOB_PREFIX}k"
    started = time.perf_counter()
    async with Store(endpoint, security=security) as store:
        await store.put(key, b"0")
        out["connect"].append(time.perf_counter() - started)
        for i in range(calls):
            t = time.perf_counter()
            await store.put(key, str(i).encode())
            out["put"].append(time.perf_counter() - t)
            t = time.perf_counter()
            await store.get(key)
            out["get"].append(time.perf_counter() - t)
            t = time.perf_counter()
            await store.txn([ValueIs(key, str(i).encode())], [Put(key, str(i + 1).encode())])
            out["txn"].append(time.perf_counter() - t)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20, help="rounds per configuration (%(default)s)")
    parser.add_argument("--calls", type=int, default=50, help="put+get+txn per round (%(default)s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="recoverd-bench-tls-") as tmp:
        folder = Path(tmp)
        _certs(folder)
        tls = ServerTLS(
            str(folder / "server.pem"), str(folder / "server-key.pem"), client_ca_file=str(folder / "ca.pem")
        )
        servers = {"plain": EmbeddedEtcd(), "tls": EmbeddedEtcd(tls=tls), "tls+auth": EmbeddedEtcd(tls=tls)}
        for etcd in servers.values():
            etcd.start()
        try:
            _enable_auth(servers["tls+auth"], folder)
            setups = {
                "plain": (servers["plain"].endpoint, EtcdSecurity()),
                "tls": (servers["tls"].url, _security(folder, "root")),
                "tls+auth": (servers["tls+auth"].url, _security(folder, "recoverd-agent-bench")),
            }
            samples: dict[str, dict[str, list[float]]] = {c: {op: [] for op in OPS} for c in CONFIGS}
            for r in range(args.rounds):
                order = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
                for config in order:
                    endpoint, security = setups[config]
                    asyncio.run(_round(endpoint, security, args.calls, samples[config]))
        finally:
            for etcd in servers.values():
                etcd.stop()
    table: dict[str, Any] = {}
    for config in CONFIGS:
        table[config] = {}
        for op in OPS:
            values = samples[config][op]
            p50, p99 = _pct(values, 0.5), _pct(values, 0.99)
            base = statistics.median(samples["plain"][op])
            table[config][op] = {
                "n": len(values),
                "p50_ms": round(1000 * p50, 3),
                "p99_ms": round(1000 * p99, 3),
                "p50_ratio_to_plain": round(p50 / base, 3),
            }
    result = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "rounds": args.rounds,
        "calls_per_round": args.calls,
        "etcd": "embedded, stock flags (fsync on)",
        "results": table,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "tls.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# TLS and authentication: cost per etcd call (bench/tls.py)",
        "",
        f"{result['when']}, {args.rounds} alternating rounds x {args.calls} calls;"
        " ms, p50 / p99 (ratio of p50 to plain)",
        "",
        "| call | " + " | ".join(CONFIGS) + " |",
        "|---|" + "---|" * len(CONFIGS),
    ]
    for op in OPS:
        cells = [
            f"{table[c][op]['p50_ms']:.2f} / {table[c][op]['p99_ms']:.2f} ({table[c][op]['p50_ratio_to_plain']:.2f}x)"
            for c in CONFIGS
        ]
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    (RESULTS / "tls.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
