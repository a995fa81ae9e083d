"""A log line per interval for events that can come by the thousand (refused or evicted
connections, forged acks): the count since the last line and the last event's detail,
instead of one line per event. Used by the controller's listeners
(terra_controller/transport.py, rest.py) and the agent's (terra_agent/admission.py,
agent.py); each log is used by one thread (the accept thread of a controller's server, an
agent's trio loop), so it holds no lock.
"""

from __future__ import annotations

import logging
import time


class RateLimitedLog:
    """Logs one kind of event at most once per `interval_s`, with the count since the last line.

    ``log.event(detail)`` counts the event and, when the interval has passed, logs
    "<what>: N in the last S s (last: detail)" at `level`: a flood of refused
    connections writes a line per interval, not a line per connection.
    """

    def __init__(self, logger: logging.Logger, what: str, level: int = logging.WARNING,
                 interval_s: float = 10.0) -> None:  # fmt: skip
        self.logger, self.what, self.level, self.interval_s = logger, what, level, interval_s
        self.count = 0  # events not logged yet
        self.total = 0  # events ever
        self.last_logged = -float("inf")

    def event(self, detail: object = "") -> None:
        """Count one event; log the count when `interval_s` passed since the last line."""
        now = time.monotonic()
        self.count += 1
        self.total += 1
        if now - self.last_logged < self.interval_s:
            return
        count, self.count = self.count, 0
        since, self.last_logged = now - self.last_logged, now
        window = f"{since:.0f} s" if since != float("inf") else "start"
        if since == float("inf"):
            self.logger.log(self.level, "%s (%s)", self.what, detail)
        else:
            self.logger.log(self.level, "%s: %d in the last %s (last: %s)", self.what, count,
                            window, detail)  # fmt: skip
