"""How the workers come to agree: every worker takes one rank's variables
(:func:`broadcast_variables`), and every rank learns at the same step which
ranks were signalled (:class:`SignalAgreement`, on the schedule of
:class:`CheckInterval`), a cloud VM's revocation notice counting as a
signal (:class:`RevocationNotices`). The preemption checkpoint, the
broadcast callback and the elastic state and callbacks build on them.

Example:

>>> from keras_adapt import coordination
>>> coordination.EXIT_CODE, [s.name for s in coordination.SIGNALS]
(75, ['SIGTERM', 'SIGINT'])
"""

from keras_adapt.coordination.broadcast import broadcast_variables
from keras_adapt.coordination.revocation_notices import RevocationNotices, as_notices
from keras_adapt.coordination.signal_agreement import (
    EXIT_CODE,
    SIGNALS,
    CheckInterval,
    SignalAgreement,
    auto_check_interval,
)

__all__ = [
    "EXIT_CODE",
    "SIGNALS",
    "CheckInterval",
    "RevocationNotices",
    "SignalAgreement",
    "as_notices",
    "auto_check_interval",
    "broadcast_variables",
]
