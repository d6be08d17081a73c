"""A StatsD receiver on loopback for tests: Airflow's metrics client (the `statsd` library,
as Airflow's ``[metrics] statsd_on`` uses it) sends real UDP datagrams to it; it keeps the
last value of each gauge and timer and the sum of each counter."""

from __future__ import annotations

import socket
import threading
from typing import Any


class StatsdReceiver:
    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, name="statsd-receiver",
                                        daemon=True)

    def __enter__(self) -> StatsdReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()

    def airflow_env(self) -> dict[str, str]:
        """Airflow's [metrics] settings that send to this receiver."""
        return {"AIRFLOW__METRICS__STATSD_ON": "True",
                "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__STATSD_PORT": str(self.port),
                "AIRFLOW__METRICS__STATSD_PREFIX": "airflow"}

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data, _ = self._sock.recvfrom(65535)
            except TimeoutError:
                continue
            except OSError:
                return
            self.lines.extend(data.decode("utf-8", "replace").splitlines())

    def metrics(self) -> dict[str, float]:
        """name -> the last gauge or timer value, or the counter's sum."""
        out: dict[str, float] = {}
        for line in list(self.lines):
            name, _, rest = line.partition(":")
            value, _, kind = rest.partition("|")
            kind = kind.split("|")[0]
            if kind == "c":
                out[name] = out.get(name, 0.0) + float(value)
            else:
                out[name] = float(value)
        return out
