#!/usr/bin/python3
"""Top-k sparsification with error feedback on the allreduce trainer against dense gradients:
the Fashion-MNIST example's recipe (20 epochs, cosine schedule, batch 128, seed 1) on 2 ranks
over TCP, dense and at 10% and 1% density. Prints the final test accuracy, its gap to dense,
the bytes each rank hands its collectives per step (dense: the float gradient; top-k: an int32
index and a float value per kept entry) and the bytes each rank sends per step in the ring
algorithms the trainer runs (dense: ring allreduce, 2 (P-1)/P of the gradient; top-k: ring
allgather of every rank's pairs, (P-1) times this rank's), and samples/s (the rounds
alternate configurations; the median is shown).

  /usr/bin/python3 bench/topk_convergence.py --build build [--epochs 20] [--rounds 1] [--json out.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

CONFIGS = [("dense", ["--compress", "none"]), ("top-k 10%", ["--compress", "topk", "--density", "0.1"]),
           ("top-k 1%", ["--compress", "topk", "--density", "0.01"])]


def run(build, ranks, extra):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [os.path.join(build, "tools", "dtrain-run"), "-n", str(ranks),
               os.path.join(build, "examples", "fashion_mnist"),
               "--log-every", "0", "--json", out.name] + extra
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        return json.load(open(out.name))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--json", default="")
    args = p.parse_args()
    results = {label: [] for label, _ in CONFIGS}
    for _ in range(args.rounds):
        for label, extra in CONFIGS:
            results[label].append(run(args.build, args.ranks, extra + ["--epochs", str(args.epochs)]))
    P = args.ranks
    dense_acc = results["dense"][0]["test_accuracy"]
    print(f"Fashion-MNIST MLP, {P} ranks over TCP, {args.epochs} epochs, seed 1 ({args.rounds} round(s))")
    print(f"{'compression':<12} {'test acc':>9} {'vs dense':>9} {'payload B/step':>15}"
          f" {'ring wire B/step':>17} {'samples/s':>10}")
    rows = []
    for label, _ in CONFIGS:
        r = results[label]
        acc = r[0]["test_accuracy"]  # synchronous and seeded: every round gives the same accuracy
        payload = r[0]["payload_bytes_per_step"]
        wire = 2 * (P - 1) / P * payload if label == "dense" else (P - 1) * payload
        sps = statistics.median(x["samples_per_second"] for x in r)
        rows.append({"compression": label, "test_accuracy": acc, "gap_to_dense": acc - dense_acc,
                     "payload_bytes_per_step": payload, "ring_wire_bytes_per_step": wire, "samples_per_second": sps})
        print(f"{label:<12} {acc:>9.4f} {acc - dense_acc:>+9.4f} {payload:>15.0f} {wire:>17.0f} {sps:>10.0f}")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
