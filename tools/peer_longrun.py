"""Run one peer queue on one scenario for longer than the matrix's bound, and print what its
workers did: issue 20's observations that the matrix's short bounds cannot show (PgQueuer's
re-pick every ~31 s after a crash, awa's rescue every ~90 s with its defaults) or that need a
setting the matrix's rows do not have (procrastinate's ``retry=True``).

    python tools/peer_longrun.py pgqueuer default crash 70
    python tools/peer_longrun.py procrastinate default poison 10 --retry true
    python tools/peer_longrun.py procrastinate recommended overrun 14 --block 6

Scenarios: ``crash`` (a crash job, an ok job behind it; one worker, restarted whenever it dies),
``overrun`` (one ``block`` job, or ``sleep`` with --sleep, of --block seconds; two workers),
``poison`` (a poison job, an ok job behind it; one worker). Needs the server (`tenantlab up`).
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tenantlab import db  # noqa: E402
from tenantlab.check import history  # noqa: E402
from tenantlab.check.adapter import Options  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("queue", choices=("procrastinate", "pgqueuer", "awa"))
    p.add_argument("setting", choices=("default", "scaled", "recommended"))
    p.add_argument("scenario", choices=("crash", "overrun", "poison"))
    p.add_argument("seconds", type=float)
    p.add_argument("--lease", type=float, default=2.0)
    p.add_argument("--block", type=float, default=None, help="overrun: the job's seconds")
    p.add_argument("--sleep", action="store_true", help="overrun: a yielding body, not blocking")
    p.add_argument("--retry", default=None, help="procrastinate: the task's retry (true, N)")
    a = p.parse_args(argv)
    row = next(r for r in importlib.import_module(f"tenantlab.check.queues.{a.queue}").rows()
               if r.setting == a.setting)
    options = Options(lease=a.lease, max_attempts=3,
                      extra={"retry": a.retry} if a.retry is not None else {})
    print(f"{a.queue} {row.version()} {a.setting} {a.scenario} for {a.seconds:g} s; "
          f"lease {a.lease:g} s, max_attempts 3{f', retry={a.retry}' if a.retry else ''}")
    with db.scratch(f"longrun_{a.queue}") as s, tempfile.TemporaryDirectory() as tmp:
        row.install(s.admin)
        if a.scenario == "overrun":
            kind = "sleep" if a.sleep else "block"
            jobs = {row.enqueue(s.admin, kind, 1, {"seconds": a.block or 3 * a.lease}, options): kind}
        else:
            jobs = {row.enqueue(s.admin, a.scenario, 1, {}, options): a.scenario}
            jobs[row.enqueue(s.admin, "ok", 2, {}, options)] = "ok"
        hist = str(Path(tmp) / "history.jsonl")
        argv_w = row.worker_command(s.admin, hist, options)
        t0 = time.time()
        procs = [subprocess.Popen(argv_w, stderr=subprocess.DEVNULL)
                 for _ in range(2 if a.scenario == "overrun" else 1)]
        m = row.maintenance_command(s.admin, options)
        keeper = subprocess.Popen(m, stderr=subprocess.DEVNULL) if m else None
        deaths = 0
        try:
            while time.time() - t0 < a.seconds:
                for i, proc in enumerate(procs):
                    if proc.poll() is not None:  # the suite's habit: a dead worker is replaced
                        deaths += 1
                        procs[i] = subprocess.Popen(argv_w, stderr=subprocess.DEVNULL)
                time.sleep(0.05)
            states = row.states(s.admin)
        finally:
            for proc in procs + ([keeper] if keeper else []):
                proc.kill()
                proc.wait()
        runs = history.by_job(history.read(hist))
        print(f"workers that died: {deaths}")
        for job, label in jobs.items():
            execs = runs.get(job, [])
            attempts = [e.attempt for e in execs]
            shown = attempts if len(attempts) <= 8 else [*attempts[:4], "...", *attempts[-3:]]
            ok = sum(e.outcome == "ok" for e in execs)
            print(f"job {job} ({label}): {len(execs)} executions ({ok} ended ok), "
                  f"attempts {shown}, state {states.get(job)}")
            for e in execs[:5]:
                end = "-" if e.end is None else f"{e.end - t0:.2f}"
                print(f"  pid {e.pid}  start {e.start - t0:6.2f}  end {end:>6}  {e.outcome}")
            if len(execs) > 1:  # (a crashed execution has no end: no overlap is claimed for it)
                gaps = [round(y.start - x.start, 2) for x, y in zip(execs, execs[1:], strict=False)]
                print(f"  starts apart: {gaps[:8]}{' ...' if len(gaps) > 8 else ''}")
                lives = [(x, y) for i, x in enumerate(execs) for y in execs[i + 1:]
                         if a.scenario == "overrun" and x.overlaps(y, time.time()) > 0]
                for x, y in lives[:3]:
                    print(f"  pids {x.pid} and {y.pid} ran it at once for "
                          f"{x.overlaps(y, time.time()):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
