"""The share of a step the gradients' transfer takes, and what compression would make of it.

A worker's wait in the collectives (``WorkerTimingMonitor``'s ``wait_time``)
is its wait for the slower workers plus the transfer itself. The slowest
worker arrives last and waits for no one, so the smallest wait over the
workers is the transfer alone (:func:`transfer_share`).

Sending float16 halves the bytes. With transfer time T and everything else
C, the share s = T / (C + T); at float16 it is s16 = (T / 2) / (C + T / 2),
so the float32 share is ``2 s16 / (1 + s16)``
(:func:`float32_share`). A policy that decides on the float32 share in
either state does not flip back merely because its own switch halved what
it measures.
"""


def transfer_share(step_times, wait_times):
    """The transfer's share of a step: min over workers of wait / step
    (NaN when nothing was timed).

    Example:

    >>> from keras_adapt.formulas.communication import transfer_share
    >>> transfer_share([0.10, 0.10], [0.06, 0.025])  # rank 1 is slow: rank 0 waits for it
    0.25
    """
    shares = [w / s for s, w in zip(step_times, wait_times) if s > 0.0]
    return min(shares) if shares else float("nan")


def float32_share(share, fp16):
    """The transfer's share of a step at float32, from ``share`` measured
    with float16 gradients (``fp16`` True: bytes halved) or float32.

    Example:

    >>> from keras_adapt.formulas.communication import float32_share
    >>> float32_share(0.25, fp16=True), float32_share(0.4, fp16=False)
    (0.4, 0.4)
    """
    return 2.0 * share / (1.0 + share) if fp16 else share
