#!/usr/bin/python3
"""compare_pytorch.py: PyTorch's CPU attention against selfattn's fused kernel on the shapes of fused_bench.cpp.

Prints one table: shape, our GFLOP/s, PyTorch's GFLOP/s, the ratio, and the peak RSS of each process.
Results and the commands that produced them: docs/performance.md ("Against PyTorch").

    /usr/bin/python3 bench/compare_pytorch.py --fused-bench build-perf/bench/bench_fused_bench
    /usr/bin/python3 bench/compare_pytorch.py --fused-json full.json     # reuse a fused_bench JSON run (no RSS)
    /usr/bin/python3 bench/compare_pytorch.py --sizes 512,4096 --dims 64 --threads 1   # a subset

Shapes (those of bench/fused_bench.cpp): fp32, B = 1, self-attention Lq = Lk = N, H = 8 heads up to N = 4096
and H = 1 above, D = Dv in {64, 128}, causal off / on (top-left, PyTorch's is_causal), 1 and 2 threads.

What PyTorch runs. PyTorch 1.13 (Debian's python3-torch) has no public scaled_dot_product_attention (it arrived
in 2.0). --impl math (the default) times what nn.MultiheadAttention runs in 1.13 (torch/nn/functional.py,
multi_head_attention_forward): q / sqrt(D), bmm(q, k^T) or baddbmm(mask, q, k^T) with the additive -inf mask of
nn.Transformer.generate_square_subsequent_mask, softmax, bmm(P, v), on (B H, N, D) tensors. --impl private times
1.13's undocumented F._scaled_dot_product_attention (the math path of the later public function).
Passes: "fwd" is the forward under torch.no_grad(); "fwd+bwd" is the forward with autograd and
torch.autograd.grad(out, (q, k, v), dout).

FLOPs, exactly fused_bench's counter: forward 4 B H N^2 D (two GEMMs of N^2 D multiply-adds), backward 2.5 times
that, so fwd+bwd is 3.5 times the forward; causal runs are credited with the full square. Our fwd+bwd time is
BM_fused_forward's plus BM_fused_backward's. The script checks that fused_bench's FLOP/s times its CPU time gives
the FLOPs it computes itself.

Clocks, as docs/performance.md: 1 thread is CPU time of the process (steadier on a shared machine), 2 threads
wall time (what the caller waits for); --wall uses wall time everywhere. Medians of --reps repetitions of at
least --min-time seconds each, after one warm-up call (Google Benchmark's scheme, same defaults as the docs).

Peak RSS: every PyTorch shape runs in its own child process, which reports its ru_maxrss (resource.getrusage;
tracemalloc would miss ATen's allocations); the RSS of a child that only imports torch is printed as the
baseline. With --fused-bench, every shape of ours runs in its own fused_bench process too, whose ru_maxrss comes
from os.wait4 (the fwd+bwd process runs BM_fused_backward, whose setup also runs the forward).

Threads: the child sets OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS to t before importing torch
(Debian's torch calls the system BLAS, OpenBLAS, whose own threads torch.set_num_threads does not control), and
calls torch.set_num_threads(t). fused_bench sets its thread count itself (threads:t, omp_set_num_threads).

The script is not part of the build or of CI; without torch it says so and exits 0. Run timing under the
benchmark lock on shared machines: flock /tmp/selfattn-bench.lock /usr/bin/python3 bench/compare_pytorch.py ...
"""

import argparse
import importlib.util
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

BATCH = 1
SIZES = [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
PASSES = ["fwd", "fwd+bwd"]


def heads_for(n):
    """fused_bench.cpp's heads_for: 8 heads up to N = 4096, 1 above."""
    return 8 if n <= 4096 else 1


def forward_flops(n, d):
    """fused_bench.cpp's forward_flops: two GEMMs of N^2 D multiply-adds per (batch, head)."""
    return 4.0 * BATCH * heads_for(n) * n * n * d


def pass_flops(n, d, pass_name):
    return forward_flops(n, d) * (1.0 if pass_name == "fwd" else 3.5)


def int_list(text):
    return [int(x) for x in text.split(",") if x]


# --------------------------------------------------------------------------------------------------------------
# The child: one PyTorch shape, timed in a fresh process so that ru_maxrss is that shape's peak.


def child_main(args):
    import torch  # noqa: the environment (thread counts) was set by the parent before this import

    torch.set_num_threads(args.threads)
    result = {"torch": torch.__version__, "num_threads": torch.get_num_threads()}
    if args.n == 0:  # the baseline: import only
        with open("/proc/self/maps") as maps:
            libs = sorted({line.split()[-1].rsplit("/", 1)[-1] for line in maps if "blas" in line})
        result["blas_libraries"] = libs
        result["maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps(result))
        return 0

    n, d, causal = args.n, args.d, bool(args.causal)
    h = heads_for(n)
    torch.manual_seed(0)
    shape = (BATCH, h, n, d)
    q, k, v, dout = (torch.randn(shape, dtype=torch.float32) for _ in range(4))
    backward = args.pass_name == "fwd+bwd"
    for t in (q, k, v):
        t.requires_grad_(backward)

    if args.impl == "math":
        # nn.MultiheadAttention's path in 1.13: tensors as (B H, N, D), the mask an additive (N, N) float tensor
        # built once by the user (nn.Transformer.generate_square_subsequent_mask), not per call.
        mask = torch.triu(torch.full((n, n), float("-inf")), diagonal=1) if causal else None
        scale_div = math.sqrt(d)

        def attention():
            q3, k3, v3 = (t.reshape(BATCH * h, n, d) for t in (q, k, v))
            q_scaled = q3 / scale_div
            if mask is not None:
                s = torch.baddbmm(mask, q_scaled, k3.transpose(-2, -1))
            else:
                s = torch.bmm(q_scaled, k3.transpose(-2, -1))
            p = torch.softmax(s, dim=-1)
            return torch.bmm(p, v3).reshape(shape)
    else:
        import torch.nn.functional as F

        def attention():
            return F._scaled_dot_product_attention(q, k, v, None, 0.0, False, causal)[0]

    if backward:
        def call():
            out = attention()
            return torch.autograd.grad(out, (q, k, v), dout)
    else:
        def call():
            with torch.no_grad():
                return attention()

    call()  # warm-up
    cpu_times, wall_times = [], []
    for _ in range(args.reps):
        iterations = 0
        wall0, cpu0 = time.perf_counter(), time.process_time()
        while True:
            call()
            iterations += 1
            wall = time.perf_counter() - wall0
            if wall >= args.min_time:
                break
        cpu = time.process_time() - cpu0
        cpu_times.append(cpu / iterations)
        wall_times.append(wall / iterations)
    result.update({
        "cpu_s": statistics.median(cpu_times),
        "wall_s": statistics.median(wall_times),
        "cpu_all": cpu_times,
        "wall_all": wall_times,
        "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    })
    print(json.dumps(result))
    return 0


def run_child(script, impl, n, d, causal, pass_name, threads, reps, min_time):
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    cmd = [sys.executable, script, "--child", "--impl", impl, "--n", str(n), "--d", str(d), "--causal",
           str(int(causal)), "--pass-name", pass_name, "--threads", str(threads), "--reps", str(reps),
           "--min-time", str(min_time)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(f"PyTorch child failed ({' '.join(cmd)}):\n{proc.stderr}\n")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------------------------
# Our side: fused_bench, run per shape or read from a JSON file.


def bench_name(kind, n, d, causal, threads):
    return f"BM_fused_{kind}/{n}/D:{d}/causal:{int(causal)}/threads:{threads}"


def summarise(benchmarks):
    """{run_name: entry}: the median aggregate where repetitions were run, else the single run."""
    chosen = {}
    for b in benchmarks:
        name = b.get("run_name", b["name"])
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                chosen[name] = b
        elif name not in chosen or chosen[name].get("run_type") != "aggregate":
            chosen.setdefault(name, b)  # the first repetition when no aggregate exists
    # Strip the "/process_time" suffix Google Benchmark appends for MeasureProcessCPUTime.
    return {k.replace("/process_time", "").replace("/real_time", ""): v for k, v in chosen.items()}


TIME_UNIT_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def our_seconds(entry, flops, use_wall):
    """Seconds per iteration on the table's clock, after checking that fused_bench counted `flops`."""
    cpu_s = entry["cpu_time"] * TIME_UNIT_S[entry["time_unit"]]
    counted = entry["FLOP/s"] * cpu_s
    if abs(counted / flops - 1.0) > 0.02:  # exact for an odd number of repetitions
        sys.exit(f"FLOP count mismatch for {entry['name']}: fused_bench {counted:.6g}, this script {flops:.6g}")
    if use_wall:
        return flops / entry["wall_FLOP/s"]
    return cpu_s


def run_fused_bench(binary, filter_regex, reps, min_time):
    """Runs fused_bench on one filter; returns ({name: entry}, peak RSS in kB)."""
    cmd = [binary, f"--benchmark_filter={filter_regex}", "--benchmark_format=json",
           f"--benchmark_repetitions={reps}", "--benchmark_report_aggregates_only=true",
           f"--benchmark_min_time={min_time}"]
    # Output to files, not pipes: os.wait4 (for the child's ru_maxrss) must not wait on a child blocked on a full pipe.
    with tempfile.TemporaryFile("w+") as out_file, tempfile.TemporaryFile("w+") as err_file:
        proc = subprocess.Popen(cmd, stdout=out_file, stderr=err_file)
        _, _, rusage = os.wait4(proc.pid, 0)
        proc.returncode = 0  # reaped by wait4: Popen must not wait for it again
        out_file.seek(0)
        err_file.seek(0)
        out, err = out_file.read(), err_file.read()
    if not out.strip():
        sys.stderr.write(f"fused_bench printed nothing for {filter_regex}: {err.strip()[:300]}\n")
        return {}, None
    return summarise(json.loads(out)["benchmarks"]), rusage.ru_maxrss


# --------------------------------------------------------------------------------------------------------------


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def fmt(x, digits=1):
    return "—" if x is None else f"{x:.{digits}f}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fused-bench", help="path of bench_fused_bench: run it per shape (times and peak RSS)")
    p.add_argument("--fused-json", help="a JSON file written by bench_fused_bench (--benchmark_out): times only")
    p.add_argument("--sizes", type=int_list, default=SIZES, help="N values, comma-separated (default: all)")
    p.add_argument("--dims", type=int_list, default=[64, 128], help="D values (default 64,128)")
    p.add_argument("--causal", type=int_list, default=[0, 1], help="0,1 (default both)")
    p.add_argument("--threads", type=int_list, default=[1, 2], help="thread counts (default 1,2)")
    p.add_argument("--passes", default=",".join(PASSES), help="fwd,fwd+bwd (default both)")
    p.add_argument("--impl", choices=["math", "private"], default="math",
                   help="PyTorch code timed: nn.MultiheadAttention's math (default) or F._scaled_dot_product_attention")
    p.add_argument("--reps", type=int, default=5, help="repetitions, medians reported (default 5)")
    p.add_argument("--min-time", type=float, default=0.3, help="seconds per repetition at least (default 0.3)")
    p.add_argument("--wall", action="store_true", help="wall time for 1 thread too (default: CPU time)")
    p.add_argument("--out", help="also write every measurement to this JSON file")
    # The child process (internal).
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--d", type=int, help=argparse.SUPPRESS)
    p.add_argument("--pass-name", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.child:
        args.causal = args.causal[0]
        args.threads = args.threads[0]
        return child_main(args)

    if importlib.util.find_spec("torch") is None:
        print(f"PyTorch is not installed for {sys.executable} (Debian: apt install python3-torch): nothing to "
              "compare against. Skipping.")
        return 0
    passes = [x for x in args.passes.split(",") if x]
    for x in passes:
        if x not in PASSES:
            p.error(f"--passes: unknown pass {x!r} (expected fwd or fwd+bwd)")
    script = os.path.abspath(__file__)

    ours_json = {}
    if args.fused_json:
        with open(args.fused_json) as f:
            ours_json = summarise(json.load(f)["benchmarks"])

    base = run_child(script, args.impl, 0, 0, 0, "fwd", 1, 0, 0.0)
    if base is None:
        return 1
    print(f"# {cpu_model()}, {os.cpu_count()} CPUs; PyTorch {base['torch']} ({args.impl}), BLAS "
          f"{', '.join(base['blas_libraries']) or 'none found'}; RSS of a process that only imports torch: "
          f"{base['maxrss_kb'] / 1024:.0f} MB")
    print(f"# fp32, B = {BATCH}, Lq = Lk = N; GFLOP/s = nominal FLOPs (forward 4 B H N^2 D, fwd+bwd 3.5 times that,"
          f" causal credited with the full square) per second of "
          f"{'wall time' if args.wall else 'CPU time (1 thread) or wall time (2 threads)'}; "
          f"medians of {args.reps} x >= {args.min_time} s")
    print()
    print("| pass | N | H | D | causal | threads | selfattn GFLOP/s | PyTorch GFLOP/s | selfattn / PyTorch "
          "| selfattn peak RSS MB | PyTorch peak RSS MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    records = []
    for n in args.sizes:
        for d in args.dims:
            for causal in args.causal:
                for threads in args.threads:
                    use_wall = args.wall or threads > 1
                    ours_fwd_s, ours_fwd_rss = None, None
                    for pass_name in passes:
                        flops = pass_flops(n, d, pass_name)
                        # ---- ours
                        ours_s, ours_rss = None, None
                        fwd_name = bench_name("forward", n, d, causal, threads)
                        bwd_name = bench_name("backward", n, d, causal, threads)
                        needed = [fwd_name] if pass_name == "fwd" else [fwd_name, bwd_name]
                        entries = {}
                        if args.fused_bench:
                            for name in needed:
                                if name == fwd_name and ours_fwd_s is not None:
                                    continue  # measured for the fwd row of this shape already
                                got, rss = run_fused_bench(args.fused_bench, "^" + name + "(/|$)", args.reps,
                                                           args.min_time)
                                entries.update(got)
                                if rss is not None:
                                    ours_rss = rss if ours_rss is None else max(ours_rss, rss)
                        else:
                            entries = ours_json
                        seconds = []
                        for name, factor in zip(needed, (1.0, 2.5)):
                            if name == fwd_name and ours_fwd_s is not None:
                                seconds.append(ours_fwd_s)
                            elif name in entries:
                                seconds.append(our_seconds(entries[name], factor * forward_flops(n, d), use_wall))
                        if len(seconds) == len(needed):
                            ours_s = sum(seconds)
                        if pass_name == "fwd":
                            ours_fwd_s, ours_fwd_rss = ours_s, ours_rss
                        elif ours_fwd_rss is not None and ours_rss is not None:
                            ours_rss = max(ours_rss, ours_fwd_rss)
                        # ---- PyTorch
                        theirs = run_child(script, args.impl, n, d, causal, pass_name, threads, args.reps,
                                           args.min_time)
                        theirs_s = None if theirs is None else theirs["wall_s" if use_wall else "cpu_s"]
                        ours_g = None if ours_s is None else flops / ours_s / 1e9
                        theirs_g = None if theirs_s is None else flops / theirs_s / 1e9
                        ratio = None if ours_g is None or theirs_g is None else ours_g / theirs_g
                        ours_mb = None if ours_rss is None else ours_rss / 1024
                        theirs_mb = None if theirs is None else theirs["maxrss_kb"] / 1024
                        print(f"| {pass_name} | {n} | {heads_for(n)} | {d} | {causal} | {threads} | {fmt(ours_g)} | "
                              f"{fmt(theirs_g)} | {fmt(ratio, 2)} | {fmt(ours_mb, 0)} | {fmt(theirs_mb, 0)} |",
                              flush=True)
                        records.append({"pass": pass_name, "n": n, "h": heads_for(n), "d": d, "causal": causal,
                                        "threads": threads, "clock": "wall" if use_wall else "cpu", "flops": flops,
                                        "selfattn_s": ours_s, "pytorch_s": theirs_s, "selfattn_gflops": ours_g,
                                        "pytorch_gflops": theirs_g, "ratio": ratio, "selfattn_rss_mb": ours_mb,
                                        "pytorch_rss_mb": theirs_mb, "pytorch": theirs})
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"baseline": base, "impl": args.impl, "records": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
