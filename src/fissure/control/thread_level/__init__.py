"""Thread-level elasticity: which thread level the in-worker scheduler should run at next.

Two policies, both pure (no threads, no clock reads, no I/O): each period the caller hands in a
`PeriodMeasurement` (the throughput seen during the period, the CPU usage, the time) and gets a
`ThreadLevelDecision` back, a frozen value that carries its reason: policies of the loop
contract (fissure.control.loop), realized in the worker by setting the scheduler's thread level
(fissure.runtime.elastic.runner) and in `fissure elastic-sim` on synthetic curves.

- `TrustTrendPolicy`: updateThreadLevel() of Schneider & Wu, "Low-synchronization, mostly
  lock-free, elastic scheduling for streaming runtimes" (IBM Streams 4.2): a record per level with
  trust, trends towards the level below and the level above, all trust dropped on a change in
  load, the CPU-usage check before any increase.
- `ElasticOperatorPolicy`: the elastic operator algorithm of Schneider et al., "Elastic scaling of
  data parallel operators in stream processing" (IPDPS 2009): peak and last rate per level, decay
  of the peak, invalidation of the peaks above on a big gain, the peaking state after a decrease.

The papers' rules are kept as written, and `ElasticityConfig.as_written()` (the "as-written" preset) turns every
improvement below off. On synthetic curves (`fissure elastic-sim`; docs/elastic-scheduler.md has
the numbers) the rules as written settle far from the best level: their threshold applies to one
more thread, which at 20 threads asks for a steeper slope than linear scaling has; they only look
one step up or down, so a slow start hides a far better level; single noisy samples raise false
trends and false changes in load. On a real machine one period's throughput at a fixed level
varies by 10-15 %, which single-sample comparisons cannot resolve at all: improvements 3-5, 8 and
10 are about that. The improvements, each a named step behind a parameter:

1. Level ladder (`ladder_ratio`): the level below and the level above are the neighbouring rungs
   of a geometric ladder (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, ...), which the Streams paper's separate
   `levelBelow` / `levelAbove` allow, instead of +-1.
2. Sensitivity per doubling (`sensitivity_per_doubling`): a trend from level a to level b needs a
   relative gain of (1 + SENS) ** log2(b / a) - 1, so SENS means the same at 2 threads as at 20.
3. Smoothing (`smoothing_window`): a level's throughput is the mean of its last samples (up to
   32: a level held for long gets a sharp estimate; comparisons weigh means by their sample counts).
4. Significance (`trend_noise_z`): a trend must also exceed that many standard errors of the
   measurement noise, estimated robustly from every sample taken at a level measured before
   (`assumed_noise`, a cautious 10 %, until samples tell).
5. Confirmed change in load (`load_change_confirmations`, `load_change_noise_z`): several
   deviating samples in a row at one level, each beyond SENS and beyond the noise; or
   (`load_change_window`, `load_change_mean_z`) the mean of the level's last few samples departing
   from the mean of its earlier ones; with `elastic_operator_load_change` the elastic operator
   starts afresh on the same tests.
6. Trust horizon (`trust_horizon_periods`): what a level not visited for that many periods recorded
   is forgotten (the Streams paper's `lastTime`, unused as written), so neighbours get re-probed
   and a change that leaves the current level's rate as it was is still found; a refinement (8)
   is redone after three horizons.
7. Coarse scan (`coarse_scan_ratio`): at the start and after each change in load, measure a few
   levels spread over the whole range, one period each, and start the rules from the best.
8. Refinement (`refine`, `refine_samples`): when the rules first hold at a level in an epoch,
   measure every level between its two neighbouring rungs and go to the best. Without the settled
   state (10): one period each, the best is the smallest within `settle_tie_margin`, and the rules
   go on from there. With it: the rungs join, and a race of successive halving (every level left
   sampled as often, the better half kept, up to `refine_samples` each; a level the leader beats
   significantly drops out) picks the level with the highest mean (neighbours at half weight).
9. Guard (`decrease_guard_margin`): a decrease for want of a trend only goes to a level measured
   close to the best of the epoch, and a level measured clearly below the best moves towards it,
   so that many small "no trend" steps cannot add up to a large loss on a long gentle slope.
10. Settled state (`settle`, `settle_noise_z`, `probe_interval_periods`,
   `max_probe_interval_periods`, `probe_samples`): after the refinement the policy holds the
   chosen level and keeps sampling it. Now and then it probes one neighbouring rung (alternating
   sides), and moves there only when that rung's mean beats the held level's by the papers'
   threshold (SENS per doubling for trust-trend, TOLERANCE for the elastic operator) plus
   `settle_noise_z` standard errors of the two means; a probe that finds no gain doubles the
   interval to the next one. The rules run the search; the settled state replaces their
   re-probing (the trust horizon, the elastic operator's peak decay and invalidation) until a
   change in load, which starts a new epoch (scan, rules, refinement) as before.
11. Local rescan (`load_change_scan_span`): after a change in load the coarse scan covers only its
   levels within that factor of the level in force, not the whole range from 1, and goes on past
   an end of it that is the best or not clearly below the best (a best that moved far, or a floor
   or plateau with no slope for the rules). A new epoch's scan of levels 1, 2, 3 costs most of its
   periods' throughput, and a change that was only the machine drifting (a slow 20-30 % swing at
   one level passes the tests of 5) pays all of it. Every scan climbs only while the CPU usage is
   acceptable (the Streams paper's check before any increase).
"""
