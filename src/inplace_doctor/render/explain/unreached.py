"""The sentence of each reason a prediction ended unconfirmed (`causes.Unreached`)."""

from __future__ import annotations

from ...causes import Unreached
from ...explanations import says_unreached

says_unreached(
    {
        Unreached.STOPPED_AT_INPLACE_ERROR: (
            "backward stopped at an earlier in-place error before reaching this tensor; fix that one and run "
            "again to confirm this."
        ),
        Unreached.STOPPED_AT_ERROR: (
            "backward stopped at an earlier error (raised inside backward) before reaching this tensor; fix that "
            "one and run again to confirm this."
        ),
        Unreached.FORWARD_STOPPED: "the forward stopped before backward could reach this tensor.",
        Unreached.NO_BACKWARD: "backward was not run (forward only); a backward through this tensor would.",
        Unreached.NOT_ON_LOSS_PATH: (
            "the backward of the loss did not reach this tensor (it is not on the loss's path); a backward "
            "through it would."
        ),
        Unreached.PENDING: (
            "no backward has reached this tensor yet (the watch is still open); a backward through "
            "it will raise or compute with the overwritten values."
        ),
        Unreached.NOT_REACHED_IN_WATCH: (
            "no backward reached this tensor while watch() was active; a backward through its graph would "
            "(a graph that is freed without one is harmless)."
        ),
    }
)
