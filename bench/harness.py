#!/usr/bin/env python3
"""Side-by-side benchmark harness for the shared bench format (../shared/bench/FORMAT.md).

Runs workers of several implementations ("peers") on the workloads W1, W2 and W3 in one
invocation, against one redis-server that it starts itself on a free loopback port and
flushes before every run. Every figure is computed here from the raw timestamps the
workers write; a worker's own opinion of its speed is never read.

    python3 bench/harness.py \\
        --peer 'botmesh-redis=target/release/examples/bench_worker --backend redis' \\
        --peer 'botmesh-memory=target/release/examples/bench_worker --backend memory' \\
        --job W1:botmesh-redis --job W1:botmesh-memory --job W3:botmesh-redis \\
        --repeat 3 --out results.jsonl

A job is WORKLOAD:PEER[,PEER...][:key=value,...]; the keys override the workload's
defaults (processes, threads, keys, chats, messages, acquisitions, hold_us, ttl_ms, seed,
cs, deadline_ms). Repeats are interleaved (every job and peer once, then again) and the
order of the peers rotates between repeats, so drift in the machine's load falls on all
of them alike. Standard library only; needs `redis-server` on PATH (or --redis-server).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

DEFAULTS = {
    "W1": {"processes": 1, "threads": 1, "keys": 10_000, "cs": "redis"},
    "W2": {"processes": 4, "threads": 4, "chats": 1_000, "messages": 20_000, "cs": "redis"},
    "W3": {"processes": 4, "threads": 1, "acquisitions": 2_000, "hold_us": 1_000, "cs": "redis"},
}
COMMON = {"ttl_ms": 10_000, "seed": 12_345, "deadline_ms": 120_000}
INT_KEYS = {"processes", "threads", "keys", "chats", "messages", "acquisitions", "hold_us",
            "ttl_ms", "seed", "deadline_ms"}
READY_TIMEOUT_S = 120.0


# ---------------------------------------------------------------- a minimal RESP client

class Redis:
    """Just enough of the Redis protocol for FLUSHALL, INFO, GET and MGET."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.buf = b""

    def close(self):
        self.sock.close()

    def call(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))
        return self._reply()

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError("redis: " + rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n)
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise RuntimeError(f"redis: unexpected reply {line[:40]!r}")

    def info(self, section: str) -> dict:
        text = self.call("INFO", section).decode()
        out = {}
        for line in text.splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                out[k] = v
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A throwaway redis-server on loopback: no persistence, its own folder."""

    def __init__(self, binary: str):
        self.dir = tempfile.mkdtemp(prefix="bench-redis-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--logfile", os.path.join(self.dir, "log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client = Redis(self.port)
                if self.client.call("PING") == "PONG":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.05)
        self.version = self.client.info("server").get("redis_version", "?")

    def stop(self):
        try:
            self.client.close()
        except OSError:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------- running one measurement

def percentile(sorted_values, q: float):
    """Nearest-rank percentile of an already sorted list (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, -(-len(sorted_values) * q // 100))  # ceil(n*q/100), at least 1
    return sorted_values[int(rank) - 1]


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


class Worker:
    """One worker process: its stdout is read on a thread so READY/DONE can be awaited."""

    def __init__(self, cmd, out_file, err_file):
        self.out_file = out_file
        self.err = open(err_file, "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, start_new_session=True)
        self.lines = []
        self.cpu_s = None
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self.proc.stdout:
            with self.cv:
                self.lines.append(raw.decode(errors="replace").strip())
                self.cv.notify_all()
        with self.cv:
            self.lines.append(None)  # end of stdout
            self.cv.notify_all()

    def wait_for(self, word: str, until: float) -> bool:
        with self.cv:
            while True:
                if word in self.lines:
                    return True
                if None in self.lines:
                    return False
                left = until - time.monotonic()
                if left <= 0:
                    return False
                self.cv.wait(left)

    def go(self):
        self.proc.stdin.write(b"GO\n")
        self.proc.stdin.flush()

    def finish(self, until: float) -> int | None:
        """Reaps the worker with wait4 to learn its CPU time (user + system, its threads
        included); stops it at `until`."""
        while True:
            try:
                pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            except ChildProcessError:
                return self.proc.returncode
            if pid:
                self.cpu_s = usage.ru_utime + usage.ru_stime
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                return self.proc.returncode
            if time.monotonic() >= until:
                self.stop()
                return None
            time.sleep(0.01)

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(10)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        self.err.close()


def worker_args(workload, p, replica, port, out):
    return ["--workload", workload, "--replica", str(replica), "--replicas", str(p["processes"]),
            "--threads", str(p["threads"]), "--keys", str(p.get("keys", 10_000)),
            "--chats", str(p.get("chats", 1_000)), "--messages", str(p.get("messages", 20_000)),
            "--acquisitions", str(p.get("acquisitions", 2_000)),
            "--hold-us", str(p.get("hold_us", 1_000)), "--ttl-ms", str(p["ttl_ms"]),
            "--seed", str(p["seed"]), "--cs", p["cs"], "--port", str(port),
            "--deadline-ms", str(p["deadline_ms"]), "--out", out]


def run_once(server, workdir, peer, command, workload, p, rep):
    """Starts the workers, gives GO, collects their files. Returns (files, notes, info)."""
    server.client.call("FLUSHALL")
    before = server.client.info("stats")
    cpu_before = server.client.info("cpu")
    notes = []
    workers = []
    try:
        for i in range(p["processes"]):
            out = os.path.join(workdir, f"{peer}-{workload}-{rep}-r{i}.json")
            if os.path.exists(out):
                os.remove(out)
            err = os.path.join(workdir, f"{peer}-{workload}-{rep}-r{i}.stderr")
            cmd = command + worker_args(workload, p, i, server.port, out)
            workers.append(Worker(cmd, out, err))
        until = time.monotonic() + READY_TIMEOUT_S
        for w in workers:
            if not w.wait_for("READY", until):
                raise RuntimeError(f"{peer}: a worker did not print READY "
                                   f"(stderr in {w.err.name})")
        load = loadavg()
        for w in workers:
            w.go()
        until = time.monotonic() + p["deadline_ms"] / 1000 + 60
        files = []
        cpu = 0.0
        for w in workers:
            done = w.wait_for("DONE", until)
            rc = w.finish(until)
            cpu = None if cpu is None or w.cpu_s is None else cpu + w.cpu_s
            if not done or rc != 0:
                notes.append(f"worker exit {rc}, DONE {'seen' if done else 'missing'}")
            try:
                with open(w.out_file) as f:
                    files.append(json.load(f))
            except (OSError, ValueError) as e:
                raise RuntimeError(f"{peer}: cannot read {w.out_file}: {e}") from e
    finally:
        for w in workers:
            w.stop()
    after = server.client.info("stats")
    cpu_after = server.client.info("cpu")

    def cpu_s(d):
        return float(d.get("used_cpu_sys", 0)) + float(d.get("used_cpu_user", 0))

    info = {
        "workers_cpu_s": cpu,
        "redis_cpu_s": cpu_s(cpu_after) - cpu_s(cpu_before),
        "loadavg_before": load,
        "loadavg_after": loadavg(),
        "redis_commands": int(after.get("total_commands_processed", 0))
        - int(before.get("total_commands_processed", 0)) - 2,  # less our two INFO calls
        "redis_reads": int(after.get("total_reads_processed", 0))
        - int(before.get("total_reads_processed", 0)),
    }
    return files, notes, info


# ---------------------------------------------------------------- figures from samples

def gather(files):
    """Every sample as (t_req, t_acq, t_rel, t_done, k, worker) plus the workers' counters."""
    samples, counters = [], {"errors": 0, "acquire_timeouts": 0, "overlaps": 0, "incomplete": 0}
    versions = set()
    for fi, f in enumerate(files):
        versions.add(json.dumps(f.get("meta", {}).get("version", {}), sort_keys=True))
        for w in f.get("workers", []):
            wid = f"{fi}/{w.get('id', '?')}"
            for s in w.get("samples", []):
                samples.append((s[0], s[1], s[2], s[3], s[4], wid))
            for key in ("errors", "acquire_timeouts", "overlaps"):
                counters[key] += int(w.get(key, 0))
            counters["incomplete"] += int(bool(w.get("incomplete", False)))
    return samples, counters, sorted(versions)


def us(ns):
    return None if ns is None else round(ns / 1000, 1)


def interval_overlaps(by_chat):
    """Pairs of holds of one chat whose [t_acq, t_rel] intersect, in acquisition order."""
    n = 0
    for holds in by_chat.values():
        holds.sort()
        latest_rel = None
        for t_acq, t_rel in holds:
            if latest_rel is not None and t_acq < latest_rel:
                n += 1
            latest_rel = t_rel if latest_rel is None else max(latest_rel, t_rel)
    return n


def figures_w1_w2(workload, samples, server, p, files):
    lat = sorted(s[3] - s[0] for s in samples)
    window = max(s[3] for s in samples) - min(s[0] for s in samples)
    out = {"ops_per_s": round(len(samples) / (window / 1e9), 1),
           "p50_us": us(percentile(lat, 50)), "p99_us": us(percentile(lat, 99)),
           "extra": {"samples": len(samples), "max_us": us(lat[-1])}}
    by_chat = {}
    for s in samples:
        by_chat.setdefault(s[4], []).append((s[1], s[2]))
    out["extra"]["interval_overlaps"] = interval_overlaps(by_chat)
    if workload == "W2":
        expected = {c: len(h) for c, h in by_chat.items()}
        if p["cs"] == "redis":
            chats = sorted(expected)
            values = server.client.call("MGET", *[f"cnt:{c}" for c in chats]) if chats else []
            actual = {c: int(v or 0) for c, v in zip(chats, values)}
        else:
            counts = files[0].get("mem_counts", []) if len(files) == 1 else []
            actual = {c: (counts[c] if c < len(counts) else 0) for c in expected}
        lost = sum(max(0, expected[c] - actual[c]) for c in expected)
        extra_incr = sum(max(0, actual[c] - expected[c]) for c in expected)
        out["extra"]["lost_increments"] = lost
        out["extra"]["surplus_increments"] = extra_incr
        out["extra"]["wait_p99_us"] = us(percentile(sorted(s[1] - s[0] for s in samples), 99))
    return out


def figures_w3(samples, p):
    n_target = p["acquisitions"]
    grants = sorted(samples, key=lambda s: s[4])  # by INCR value: the true grant order
    ks = [s[4] for s in grants]
    duplicates = len(ks) - len(set(ks))
    held = [s for s in grants if s[4] <= n_target]
    workers = sorted({s[5] for s in grants})
    mine = {w: [] for w in workers}  # each worker's grant indexes, ascending
    for i, s in enumerate(grants):
        mine[s[5]].append(i)

    handoffs, fifo_hits, choices, misses = [], 0, 0, []
    for i in range(1, len(grants)):
        released = grants[i - 1]
        # Who was waiting when grant i-1 was released: each other worker's next grant from
        # i on, if it had asked before that release.
        waiting = []
        for w in workers:
            idx = mine[w]
            j = bisect.bisect_left(idx, i)
            if j < len(idx):
                g = grants[idx[j]]
                if g[0] < released[2]:
                    waiting.append(idx[j])
        if not waiting:
            continue
        first = min(waiting)  # the first of the waiters to hold the turn after the release
        handoffs.append(grants[first][1] - released[2])
        longest = min(waiting, key=lambda j: grants[j][0])
        if len(waiting) >= 2 or i not in waiting:
            choices += 1
            fifo_hits += int(i == longest)
            if i != longest and len(misses) < 5:
                # How much earlier the passed-over worker had asked: a few µs means two
                # asks that crossed on their way to the lock, not an unfair grant.
                misses.append({"seq": grants[i][4], "to": grants[i][5],
                               "longest": grants[longest][5],
                               "asked_earlier_us": us(grants[i][0] - grants[longest][0])})

    streak, best = 0, 0
    for i, s in enumerate(grants):
        streak = streak + 1 if i and s[5] == grants[i - 1][5] else 1
        best = max(best, streak)
    hold_spans = {}
    for s in grants:
        hold_spans.setdefault("hot", []).append((s[1], s[2]))
    waits = sorted(s[1] - s[0] for s in grants)
    hand = sorted(handoffs)
    window = (max(s[3] for s in held) - min(s[0] for s in held)) if held else 0
    return {
        "ops_per_s": round(len(held) / (window / 1e9), 1) if window else None,
        "p50_us": us(percentile(hand, 50)), "p99_us": us(percentile(hand, 99)),
        "max_streak": best,
        "extra": {
            "fifo_grant_pct": round(100.0 * fifo_hits / choices, 2) if choices else None,
            "fifo_choices": choices,
            "fifo_misses": misses,
            "handoffs": len(hand),
            "handoff_max_us": us(hand[-1]) if hand else None,
            "wait_p50_us": us(percentile(waits, 50)),
            "wait_p99_us": us(percentile(waits, 99)),
            "wait_max_us": us(waits[-1]) if waits else None,
            "grants": len(grants), "held": len(held),
            "missing_seq": n_target - len({k for k in ks if 1 <= k <= n_target}),
            "duplicate_seq": duplicates,
            "interval_overlaps": interval_overlaps(hold_spans),
        },
    }


def measure(server, workdir, peer, command, workload, p, rep="rep1"):
    files, notes, info = run_once(server, workdir, peer, command, workload, p, rep)
    samples, counters, versions = gather(files)
    peer_names = sorted({f.get("peer", "?") for f in files})
    if peer_names != [peer]:
        notes.append(f"worker calls itself {'/'.join(peer_names)}")
    for key in ("errors", "acquire_timeouts", "incomplete"):
        if counters[key]:
            notes.append(f"{key}: {counters[key]}")
    rec = {"peer": peer, "workload": workload,
           "params": {"processes": p["processes"], "workers_per_process": p["threads"],
                      "cs": p["cs"], "ttl_ms": p["ttl_ms"], "seed": p["seed"], "scale": 1.0}}
    if workload == "W1":
        rec["params"]["keys"] = p["keys"]
    elif workload == "W2":
        rec["params"].update(chats=p["chats"], messages=p["messages"])
    else:
        rec["params"].update(acquisitions=p["acquisitions"], hold_us=p["hold_us"])
    if not samples:
        rec.update(ops_per_s=None, p50_us=None, p99_us=None, exclusion_violations=None,
                   max_streak=None, notes="; ".join(notes + ["no samples"]), extra={})
        return rec
    if workload == "W3":
        fig = figures_w3(samples, p)
        violations = (counters["overlaps"] + fig["extra"]["interval_overlaps"]
                      + fig["extra"]["duplicate_seq"])
    else:
        fig = figures_w1_w2(workload, samples, server, p, files)
        fig["max_streak"] = None
        violations = counters["overlaps"] + fig["extra"].get("lost_increments", 0)
        expected = p["keys"] if workload == "W1" else p["messages"]
        if len(samples) != expected:
            notes.append(f"{len(samples)} of {expected} samples")
    extra = fig.pop("extra")
    extra.update(flag_overlaps=counters["overlaps"], errors=counters["errors"],
                 versions=versions, redis_version=server.version,
                 redis_commands_per_op=round(info["redis_commands"] / len(samples), 2),
                 redis_reads_per_op=round(info["redis_reads"] / len(samples), 2),
                 redis_cpu_us_per_op=round(info["redis_cpu_s"] * 1e6 / len(samples), 1),
                 workers_cpu_us_per_op=(None if info["workers_cpu_s"] is None else
                                        round(info["workers_cpu_s"] * 1e6 / len(samples), 1)),
                 loadavg_before=info["loadavg_before"], loadavg_after=info["loadavg_after"])
    rec.update(fig)
    rec["exclusion_violations"] = violations
    rec["notes"] = "; ".join(notes)
    rec["extra"] = extra
    return rec


# ---------------------------------------------------------------- command line

def parse_job(text, peers):
    parts = text.split(":", 2)
    if len(parts) < 2 or parts[0] not in DEFAULTS:
        raise SystemExit(f"--job {text!r}: expected WORKLOAD:PEER[,PEER...][:key=value,...]"
                         " with WORKLOAD one of W1, W2, W3")
    workload, names = parts[0], parts[1].split(",")
    for n in names:
        if n not in peers:
            raise SystemExit(f"--job {text!r}: peer {n!r} has no --peer {n}=COMMAND")
    p = dict(COMMON)
    p.update(DEFAULTS[workload])
    if len(parts) == 3 and parts[2]:
        for kv in parts[2].split(","):
            k, _, v = kv.partition("=")
            if k not in INT_KEYS and k != "cs":
                raise SystemExit(f"--job {text!r}: unknown key {k!r}")
            if k == "cs":
                if v not in ("redis", "mem"):
                    raise SystemExit(f"--job {text!r}: cs={v!r} is not redis or mem")
                p[k] = v
            else:
                try:
                    p[k] = int(v)
                except ValueError:
                    raise SystemExit(f"--job {text!r}: {k}={v!r} is not a whole number")
    return workload, names, p


def summary(records):
    """A markdown table: ranges over the repeats for each job and peer."""
    groups = {}
    for r in records:
        key = (r["workload"], json.dumps(r["params"], sort_keys=True), r["peer"])
        groups.setdefault(key, []).append(r)

    def rng(vals, fmt="{:,.0f}"):
        vals = [v for v in vals if v is not None]
        if not vals:
            return "–"
        lo, hi = min(vals), max(vals)
        return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}–{fmt.format(hi)}"

    lines = ["| workload | peer | runs | ops/s | p50 µs | p99 µs | violations | streak |"
             " FIFO % | longest wait ms | load avg |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (w, params, peer), rs in groups.items():
        pr = json.loads(params)
        shape = f"{w} {pr['processes']}×{pr['workers_per_process']} {pr['cs']}"
        lines.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            shape, peer, len(rs), rng([r["ops_per_s"] for r in rs]),
            rng([r["p50_us"] for r in rs], "{:,.1f}"), rng([r["p99_us"] for r in rs], "{:,.1f}"),
            rng([r["exclusion_violations"] for r in rs]), rng([r["max_streak"] for r in rs]),
            rng([r["extra"].get("fifo_grant_pct") for r in rs], "{:.1f}"),
            rng([(r["extra"].get("wait_max_us") or 0) / 1000 if w == "W3" else None
                 for r in rs], "{:,.1f}"),
            rng([(r["extra"].get("loadavg_before") or [None])[0] for r in rs], "{:.1f}")))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", action="append", default=[], metavar="NAME=COMMAND",
                    help="a worker command (split like a shell line); the protocol's flags"
                         " are appended")
    ap.add_argument("--job", action="append", default=[],
                    metavar="WORKLOAD:PEER[,PEER...][:key=value,...]")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", required=True, help="JSON lines, one record per run (appended)")
    ap.add_argument("--redis-server", default="redis-server")
    ap.add_argument("--workdir", help="where the workers' files go (default: a temp folder)")
    a = ap.parse_args()
    peers = {}
    for spec in a.peer:
        name, sep, cmd = spec.partition("=")
        if not sep or not name or not cmd.strip():
            raise SystemExit(f"--peer {spec!r}: expected NAME=COMMAND")
        peers[name] = shlex.split(cmd)
    if not a.job:
        raise SystemExit("no --job given")
    if a.repeat < 1:
        raise SystemExit(f"--repeat: {a.repeat} is below 1")
    jobs = [parse_job(j, peers) for j in a.job]
    if shutil.which(a.redis_server) is None:
        raise SystemExit(f"--redis-server: {a.redis_server!r} not found")
    workdir = a.workdir or tempfile.mkdtemp(prefix="bench-harness-")
    os.makedirs(workdir, exist_ok=True)
    server = RedisServer(a.redis_server)
    print(f"# redis-server {server.version} on 127.0.0.1:{server.port}; load average "
          f"{loadavg()}; files in {workdir}", file=sys.stderr)
    records = []
    try:
        with open(a.out, "a") as out:
            for rep in range(a.repeat):
                for ji, (workload, names, p) in enumerate(jobs):
                    shift = rep % len(names)
                    for peer in names[shift:] + names[:shift]:
                        t0 = time.monotonic()
                        try:
                            rec = measure(server, workdir, peer, peers[peer], workload, p,
                                          f"job{ji + 1}-rep{rep + 1}")
                        except RuntimeError as e:
                            print(f"# {workload} {peer}: FAILED: {e}", file=sys.stderr)
                            continue
                        rec["extra"]["repeat"] = rep + 1
                        records.append(rec)
                        out.write(json.dumps(rec) + "\n")
                        out.flush()
                        print(f"# rep {rep + 1} {workload} {peer}: {rec['ops_per_s']} ops/s, "
                              f"p50 {rec['p50_us']} µs, p99 {rec['p99_us']} µs, violations "
                              f"{rec['exclusion_violations']}, streak {rec['max_streak']}, "
                              f"fifo {rec['extra'].get('fifo_grant_pct')} "
                              f"({time.monotonic() - t0:.1f} s) {rec['notes']}", file=sys.stderr)
    finally:
        server.stop()
    print(f"# load average at the end {loadavg()}", file=sys.stderr)
    print(summary(records))


if __name__ == "__main__":
    main()
