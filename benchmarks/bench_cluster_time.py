"""The cluster time model against the emulated fabric: from an unshaped run (its compute profile), predict
the training seconds of shaped runs, and measure them, methods and link rates interleaved, in one invocation.

    sudo python benchmarks/bench_cluster_time.py --out runs/bench-cluster-time [--repeats 3] [--steps 300]
        [--rates 1gbit,100mbit,20mbit] [--methods ddp,ab,sbc,powersgd] [--latencies 0,5]
    python benchmarks/bench_cluster_time.py --out runs/bench-cluster-time --table   # the tables again

Each run is one `abtune train --launcher PROFILE` of the quickstart config, 4 ranks as 2 simulated nodes.
A repeat trains every method unshaped (the compute profile), then every (rate, method) pair; the order of
the methods turns with each repeat. The prediction of a shaped run uses the unshaped run of the same method
in the same repeat, and clusters/this-machine.yaml at the shaped rate (abtune/timing.py), with the share of
that rate one TCP stream sustains over the shaped link (measured first, by a bulk transfer, not by training). Latencies the
kernel cannot emulate (no netem) are reported as such, not measured. Results go to OUT/results.json; the
tables (predicted / measured per row with the spread over repeats; predicted time to target on the shipped
clusters, with ab's break-even rate against ddp) are printed from it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from abtune.launch.fabric import missing_requirements
from abtune.launch.profiles import parse_rate_bits
from abtune.timing import break_even_gbit, load_cluster, predict, with_link_rate

METHODS = "ddp,ab,sbc,powersgd"
SHIPPED = ("paper-a100-hdr200", "ethernet-25g", "this-machine")
UNSHAPED = "unshaped"


def profile(folder: Path, rate: str, latency_ms: float) -> Path:
    path = folder / f"link-{rate}-{latency_ms:g}ms.yaml"
    fabric = {"bandwidth": None if rate == UNSHAPED else rate, "latency_ms": latency_ms}
    path.write_text(yaml.safe_dump({"kind": "local", "fabric": fabric}))
    return path


def train(args: argparse.Namespace, run_dir: Path, method: str, rate: str, latency_ms: float) -> dict | str:
    command = [sys.executable, "-m", "abtune.cli", "train", str(args.config), "--launcher",
               str(profile(args.out, rate, latency_ms)), "--nproc", "4", "--ranks-per-node", "2",
               "--run-dir", str(run_dir), "--no-tracking", "--set", f"method.name={method}",
               "--set", f"train.steps={args.steps}", "--set", f"train.target_top1={args.target}"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        return (result.stderr.strip().splitlines() or ["failed"])[-1]
    return json.loads((run_dir / "summary.json").read_text())


RECEIVER = ("import socket,sys\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
            "s.bind(('0.0.0.0',5999));s.listen(1);print('ready',flush=True);c,_=s.accept();n=0\n"
            "while (b:=c.recv(1<<20)):\n n+=len(b)\nprint(n,flush=True)")
SENDER = ("import socket,sys,time\nc=socket.create_connection((sys.argv[1],5999));chunk=b'x'*(1<<16);t=time.perf_counter()\n"
          "for _ in range(int(sys.argv[2])): c.sendall(chunk)\nc.shutdown(socket.SHUT_WR);c.recv(1);print(time.perf_counter()-t)")


def link_efficiency(rate: str, seconds: float = 4.0) -> float:
    """One TCP stream between two nodes of a fabric shaped at `rate`, independent of training: the share of the
    rate it sustains, on the wire (payload plus 66 header bytes per 1448)."""
    from abtune.launch.fabric import Fabric, FabricSpec

    bits = parse_rate_bits(rate)
    chunks = max(1, int(bits / 8 * seconds / (1 << 16)))
    fabric = Fabric.create(FabricSpec(nodes=2, bandwidth=rate))
    try:
        receiver = subprocess.Popen([*fabric.node_prefix(1), sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE,
                                    text=True)
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
        took = float(subprocess.run([*fabric.node_prefix(0), sys.executable, "-c", SENDER, fabric.address(1),
                                     str(chunks)], capture_output=True, text=True, check=True).stdout)
        received = int(receiver.stdout.readline())
        receiver.wait(timeout=30)
    finally:
        fabric.remove()
    return received * (1 + 66 / 1448) * 8 / took / bits


def measure(args: argparse.Namespace) -> dict:
    methods = args.methods.split(",")
    rates = args.rates.split(",")
    latencies = [float(x) for x in args.latencies.split(",")]
    results: dict = {"machine": f"{platform.platform()}, {os.cpu_count()} cores", "steps": args.steps,
                     "config": str(args.config), "load_before": os.getloadavg(), "runs": [],
                     "link_efficiency": {rate: link_efficiency(rate) for rate in rates}}
    print(f"link efficiency (one TCP stream): {results['link_efficiency']}", flush=True)
    for repeat in range(args.repeats):
        order = methods[repeat % len(methods):] + methods[:repeat % len(methods)]
        for rate, latency in [(UNSHAPED, 0.0)] + [(r, lat) for lat in latencies for r in rates]:
            for method in order:
                run_dir = args.out / f"r{repeat}-{rate}-{latency:g}ms-{method}"
                started = time.perf_counter()
                outcome = train(args, run_dir, method, rate, latency)
                entry = {"repeat": repeat, "rate": rate, "latency_ms": latency, "method": method,
                         "wall_s": time.perf_counter() - started, "run_dir": str(run_dir)}
                if isinstance(outcome, str):
                    entry["error"] = outcome
                else:
                    entry["train_seconds"] = outcome["timing"]["train_seconds"]
                results["runs"].append(entry)
                print(json.dumps({k: v for k, v in entry.items() if k != "run_dir"}), flush=True)
    results["load_after"] = os.getloadavg()
    return results


def summary_of(entry: dict) -> dict:
    return json.loads((Path(entry["run_dir"]) / "summary.json").read_text())


def prediction_table(results: dict) -> list[str]:
    cluster = load_cluster("this-machine")
    runs = [r for r in results["runs"] if "error" not in r]
    profiles = {(r["repeat"], r["method"]): summary_of(r) for r in runs if r["rate"] == UNSHAPED}
    rows: dict[tuple[str, float, str], list[tuple[float, float]]] = {}
    for run in runs:
        if run["rate"] == UNSHAPED:
            continue
        linked = with_link_rate(cluster, parse_rate_bits(run["rate"]) / 1e9,
                                results.get("link_efficiency", {}).get(run["rate"], 1.0))
        predicted = predict(profiles[(run["repeat"], run["method"])], linked).train_seconds
        rows.setdefault((run["rate"], run["latency_ms"], run["method"]), []).append((predicted, run["train_seconds"]))
    lines = ["| link | latency | method | predicted s | measured s (min-max) | predicted / measured (min-max) |",
             "|---|---|---|---|---|---|"]
    for (rate, latency, method), pairs in rows.items():
        predicted = statistics.mean(p for p, _ in pairs)
        measured = [m for _, m in pairs]
        ratios = [p / m for p, m in pairs]
        lines.append(f"| {rate} | {latency:g} ms | {method} | {predicted:.2f} | {statistics.mean(measured):.2f} "
                     f"({min(measured):.2f}-{max(measured):.2f}) | {statistics.mean(ratios):.3f} "
                     f"({min(ratios):.3f}-{max(ratios):.3f}) |")
    failed: dict[tuple[str, float], set[str]] = {}
    for run in results["runs"]:
        if "error" in run and run["rate"] != UNSHAPED:
            failed.setdefault((run["rate"], run["latency_ms"]), set()).add(run["method"])
    for (rate, latency), methods in failed.items():
        why = "this kernel has no netem" if latency else "failed (see results.json)"
        lines.append(f"| {rate} | {latency:g} ms | {', '.join(sorted(methods))} | - | not measured: {why} | - |")
    unshaped = [r["train_seconds"] for r in runs if r["rate"] == UNSHAPED]
    lines.append(f"\nunshaped (the compute profiles): {min(unshaped):.2f}-{max(unshaped):.2f} s")
    return lines


def shipped_table(results: dict, target: float) -> list[str]:
    """Predicted time to `target` on the shipped clusters, from repeat 0's unshaped runs."""
    profiles = {r["method"]: summary_of(r) for r in results["runs"]
                if r["rate"] == UNSHAPED and r["repeat"] == 0 and "error" not in r}
    for summary in profiles.values():
        summary["timing"]["target_top1"] = target
    lines = ["| cluster | method | predicted step ms (by phase) | predicted train s | predicted s to target |",
             "|---|---|---|---|---|"]
    for name in SHIPPED:
        cluster = load_cluster(name)
        for method, summary in profiles.items():
            p = predict(summary, cluster)
            steps = ", ".join(f"{phase} {seconds * 1e3:.2f}" for phase, seconds in p.step_seconds.items())
            to_target = "-" if p.time_to_target_seconds is None else f"{p.time_to_target_seconds:.2f}"
            lines.append(f"| {name} | {method} | {steps} | {p.train_seconds:.2f} | {to_target} |")
        if "ab" in profiles and "ddp" in profiles:
            rate = break_even_gbit(profiles["ab"], profiles["ddp"], cluster)
            said = "none between 0.01 and 10,000 Gbit/s" if rate is None else f"{rate:.3g} Gbit/s"
            lines.append(f"| {name} | ab = ddp at | {said} | | |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--config", type=Path, default=Path("studies/run_quickstart.yaml"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rates", default="1gbit,100mbit,20mbit")
    parser.add_argument("--latencies", default="0,5")
    parser.add_argument("--methods", default=METHODS)
    parser.add_argument("--table", action="store_true", help="print the tables of OUT/results.json again")
    parser.add_argument("--shipped-target", type=float, default=0.8, help="top-1 of the shipped clusters' table")
    args = parser.parse_args()
    args.out = args.out.resolve()
    results_file = args.out / "results.json"
    if not args.table:
        if missing := missing_requirements():
            sys.exit(f"the emulated interconnect cannot run here: {missing}")
        args.out.mkdir(parents=True, exist_ok=True)
        results_file.write_text(json.dumps(measure(args), indent=1))
    results = json.loads(results_file.read_text())
    print(f"machine: {results['machine']}; {results['steps']} steps of {results['config']}, 4 ranks as 2 nodes; "
          f"load {results['load_before'][0]:.2f} before, {results['load_after'][0]:.2f} after")
    print("\n".join(prediction_table(results)))
    print()
    print(f"\npredicted time to top-1 {args.shipped_target} on the shipped clusters (repeat 0's unshaped runs):")
    print("\n".join(shipped_table(results, args.shipped_target)))


if __name__ == "__main__":
    main()
