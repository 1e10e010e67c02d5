"""Two Ray nodes against one, on this machine: the smoke matrix and a two-release sweep, side by side.

    python benchmarks/ray_cluster.py [--releases 5.15.1,5.16.0] [--rounds 1] [--json PATH]

Each arm starts its own cluster with Ray's CLI: a head node (``ray start --head --num-cpus 1``) and,
for the two-node arm, a second node joining it (``ray start --address HEAD --num-cpus 1``), each
with ports of its own. Then ``lossless-check run --matrix smoke --backend ray --address HEAD`` and
``lossless-check sweep --releases R1,R2 --modes step --backend ray --address HEAD`` run against it,
and the cluster is torn down, on failure too. The nodes run with ``--block`` in a process group
of their own, and teardown ends that group: exactly the processes this script started (``ray stop``
would end every Ray on the machine, other users' clusters too). Arms alternate, one node first,
and the figures are ratios (wall time of 1 node / 2 nodes), as benchmarks/README.md asks.

It also checks what must not change: the smoke reports of both arms and of ``--workers 2`` on the
local pool agree (timings aside), and so do the sweep's per-release reports.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The benchmark's clusters use token authentication with a token of their own, given to the nodes and
#: to every client alike: a token file another Ray user left in ``~/.ray`` then cannot get in the way.
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "RAY_USAGE_STATS_ENABLED": "0",
       "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
#: What two runs of the same cases may differ in: the time they took.
TIMINGS = ("seconds", "samples_per_second")
#: Per-node ports ``ray start`` would otherwise take at fixed defaults (two nodes on one machine collide).
NODE_PORTS = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
              "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(*args: str) -> subprocess.Popen:
    """``ray start ARGS --block --num-cpus 1``, in a new process group (its Ray processes join it)."""
    ports = [x for option in NODE_PORTS for x in (option, str(free_port()))]
    return subprocess.Popen(["ray", "start", *args, "--block", "--num-cpus", "1", "--disable-usage-stats",
                             "--node-ip-address", "127.0.0.1", *ports],
                            env=ENV, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_node(node: subprocess.Popen) -> None:
    """End the node's process group: SIGTERM (``ray start --block`` stops its Ray processes), then
    SIGKILL for whatever of the group is left."""
    for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(node.pid, sig)
        except ProcessLookupError:  # nothing of the group is left
            return
        try:
            node.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass


def alive_nodes(address: str) -> int:
    code = ("import ray; ray.init(address=%r, logging_level='ERROR', log_to_driver=False); "
            "print(sum(n['Alive'] for n in ray.nodes())); ray.shutdown()" % address)
    done = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120)
    lines = done.stdout.strip().splitlines()
    return int(lines[-1]) if done.returncode == 0 and lines and lines[-1].isdigit() else 0


@contextmanager
def cluster(nodes: int, temp: Path):
    """A cluster of ``nodes`` one-CPU nodes on this machine; yields the head's address."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    started = [start_node("--head", "--port", str(port), "--include-dashboard", "false", "--temp-dir", str(temp))]
    try:
        deadline = time.monotonic() + 120
        while alive_nodes(address) < 1:
            if time.monotonic() > deadline or started[0].poll() is not None:
                raise RuntimeError(f"the head node at {address} did not start")
            time.sleep(1)
        for _ in range(nodes - 1):
            started.append(start_node("--address", address))
        while alive_nodes(address) < nodes:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {alive_nodes(address)} of {nodes} nodes joined {address}")
            time.sleep(1)
        yield address
    finally:
        for node in reversed(started):
            stop_node(node)


def lossless_check(*args: str) -> float:
    """Run the CLI; its wall seconds (exit 0 or 1 are results; anything else fails the benchmark)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "lossless_check.faces.cli", *args], cwd=ROOT, env=ENV,
                          capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"lossless-check {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return time.perf_counter() - started


def cases(report: Path) -> list[dict]:
    return [{k: v for k, v in c.items() if k not in TIMINGS} for c in json.loads(report.read_text())["cases"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", default="5.15.1,5.16.0", help="the sweep's two releases (cached environments)")
    parser.add_argument("--rounds", type=int, default=1, help="times each arm runs (alternating)")
    parser.add_argument("--envs", default=None, help="the sweep's environment cache (default: the CLI's)")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args()
    releases = args.releases.split(",")
    envs = ["--envs", args.envs] if args.envs else []
    seconds: dict[str, dict[int, list[float]]] = {"smoke": {1: [], 2: []}, "sweep": {1: [], 2: []}}
    same: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="lc-ray-bench-") as tmp:
        work = Path(tmp)
        for round_ in range(args.rounds):
            for nodes in (1, 2):
                tag = f"{nodes}n{round_}"
                with cluster(nodes, work / f"ray-{tag}") as address:
                    on_ray = ["--backend", "ray", "--address", address]
                    seconds["smoke"][nodes].append(lossless_check(
                        "run", "--matrix", "smoke", *on_ray, "--quiet", "--json", str(work / f"smoke-{tag}.json")))
                    seconds["sweep"][nodes].append(lossless_check(
                        "sweep", "--releases", args.releases, "--modes", "step", *on_ray, *envs,
                        "--work", str(work / f"sweep-{tag}"), "--out", str(work / f"table-{tag}.md")))
                print(f"round {round_ + 1}, {nodes} node(s): smoke {seconds['smoke'][nodes][-1]:.1f} s, "
                      f"sweep {seconds['sweep'][nodes][-1]:.1f} s", file=sys.stderr, flush=True)
        lossless_check("run", "--matrix", "smoke", "--workers", "2", "--quiet", "--json", str(work / "smoke-local.json"))
        local = cases(work / "smoke-local.json")
        same["smoke: 1 node, 2 nodes and --workers 2"] = all(
            cases(work / f"smoke-{n}n{r}.json") == local for n in (1, 2) for r in range(args.rounds))
        same["sweep: 1 node and 2 nodes"] = all(
            cases(work / f"sweep-{n}n{r}" / f"{release}-step.json") == cases(work / "sweep-1n0" / f"{release}-step.json")
            for n in (1, 2) for r in range(args.rounds) for release in releases)
    figures = {what: {"one_node_s": sum(by[1]) / len(by[1]), "two_nodes_s": sum(by[2]) / len(by[2]),
                      "speedup": sum(by[1]) / sum(by[2])} for what, by in seconds.items()}
    print("| work | 1 node (s) | 2 nodes (s) | speed-up (1 node / 2 nodes) |\n|---|---|---|---|")
    for what, f in figures.items():
        print(f"| {what} | {f['one_node_s']:.1f} | {f['two_nodes_s']:.1f} | {f['speedup']:.2f}x |")
    for what, ok in same.items():
        print(f"identical reports ({what}): {ok}")
    doc = {"figures": figures, "seconds": seconds, "identical": same, "releases": releases}
    print(json.dumps(doc))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
