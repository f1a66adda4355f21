"""Checks of the harness's figures on hand-made samples: `python3 -m unittest bench/test_harness.py`."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

US = 1_000


def w3_params(n):
    return {"acquisitions": n}


class W3Figures(unittest.TestCase):
    def test_fifo_round_robin(self):
        # A holds 1, B and C wait; B (asked first) gets 2, then C gets 3, A (asked again
        # after its release) gets 4.
        s = [
            (0, 10 * US, 1010 * US, 1020 * US, 1, "A"),
            (5 * US, 1060 * US, 2060 * US, 2070 * US, 2, "B"),
            (6 * US, 2100 * US, 3100 * US, 3110 * US, 3, "C"),
            (1030 * US, 3150 * US, 4150 * US, 4160 * US, 4, "A"),
        ]
        f = harness.figures_w3(s, w3_params(4))
        self.assertEqual(f["max_streak"], 1)
        self.assertEqual(f["extra"]["fifo_grant_pct"], 100.0)
        # Handoffs: 1010→1060, 2060→2100, 3100→3150 µs.
        self.assertEqual(f["extra"]["handoffs"], 3)
        self.assertEqual(f["p50_us"], 50.0)
        self.assertEqual(f["extra"]["interval_overlaps"], 0)
        self.assertEqual(f["extra"]["wait_max_us"], 3150.0 - 1030.0)  # A's second ask

    def test_barging_is_not_fifo_and_the_handoff_runs_on(self):
        # A holds 1, B waits; A releases at 1000, asks again at once and wins 2; B gets 3.
        s = [
            (0, 0, 1000 * US, 1005 * US, 1, "A"),
            (10 * US, 2100 * US, 3100 * US, 3105 * US, 3, "B"),
            (1006 * US, 1010 * US, 2000 * US, 2005 * US, 2, "A"),
        ]
        f = harness.figures_w3(s, w3_params(3))
        self.assertEqual(f["max_streak"], 2)
        # Grant 2 (a choice: B waited) went to A: a miss; grant 3 had only B waiting and
        # went to B: no choice.
        self.assertEqual(f["extra"]["fifo_choices"], 1)
        self.assertEqual(f["extra"]["fifo_grant_pct"], 0.0)
        # The release at 1000 while B waited ends when B holds at 2100; the one at 2000
        # ends at 2100 too.
        self.assertEqual(sorted([f["p50_us"], f["p99_us"]]), [100.0, 1100.0])

    def test_overlap_and_duplicate_sequence(self):
        s = [
            (0, 0, 1000 * US, 1001 * US, 1, "A"),
            (0, 500 * US, 1500 * US, 1501 * US, 2, "B"),
            (0, 1600 * US, 1700 * US, 1701 * US, 2, "C"),
        ]
        f = harness.figures_w3(s, w3_params(3))
        self.assertEqual(f["extra"]["interval_overlaps"], 1)
        self.assertEqual(f["extra"]["duplicate_seq"], 1)
        self.assertEqual(f["extra"]["missing_seq"], 1)


class W2Figures(unittest.TestCase):
    def test_lost_increment_from_mem_counts(self):
        s = [
            (0, 10, 20, 30, 0, "A"),
            (0, 15, 25, 35, 0, "B"),  # overlaps A's hold on chat 0
            (40, 50, 60, 70, 1, "A"),
        ]
        files = [{"mem_counts": [1, 1]}]
        f = harness.figures_w1_w2("W2", s, None, {"cs": "mem"}, files)
        self.assertEqual(f["extra"]["lost_increments"], 1)
        self.assertEqual(f["extra"]["interval_overlaps"], 1)
        self.assertEqual(f["extra"]["samples"], 3)

    def test_percentile_nearest_rank(self):
        v = list(range(1, 101))
        self.assertEqual(harness.percentile(v, 50), 50)
        self.assertEqual(harness.percentile(v, 99), 99)
        self.assertEqual(harness.percentile([7], 99), 7)
        self.assertIsNone(harness.percentile([], 50))


class Jobs(unittest.TestCase):
    def test_job_overrides_and_refusals(self):
        peers = {"a": ["x"], "b": ["y"]}
        w, names, p = harness.parse_job("W3:a,b:processes=1,threads=4,cs=mem", peers)
        self.assertEqual((w, names, p["processes"], p["threads"], p["cs"]), ("W3", ["a", "b"], 1, 4, "mem"))
        self.assertEqual(p["acquisitions"], 2000)
        for bad in ("W4:a", "W1:c", "W1:a:threads=x", "W1:a:cs=disk", "W1:a:color=1"):
            with self.assertRaises(SystemExit):
                harness.parse_job(bad, peers)


if __name__ == "__main__":
    unittest.main()
