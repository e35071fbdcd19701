"""A private CA and a real forward proxy for the provider network tests: `certificates(dir)` makes
a CA (`ca.pem`) and a server certificate for 127.0.0.1 signed by it (`server.pem`, `server.key`)
with openssl; `Tinyproxy` runs Debian's tinyproxy on a free loopback port (`apt-get install -y
tinyproxy`, as .ci/run does), logging each request it serves (a CONNECT names its target)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from tests.support.procs import end


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)


def certificates(directory: Path) -> Path:
    """Make the CA and the server certificate in `directory`; returns the CA's PEM file."""
    ca = [
        "req",
        "-x509",
        "-new",
        "-nodes",
        "-newkey",
        "rsa:2048",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]
    _openssl(directory, *ca, "-days", "2", "-subj", "/CN=toolloop proxy test CA")
    csr = [
        "req",
        "-new",
        "-nodes",
        "-newkey",
        "rsa:2048",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]
    _openssl(directory, *csr, "-subj", "/CN=127.0.0.1")
    (directory / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\nauthorityKeyIdentifier=keyid,issuer\nsubjectKeyIdentifier=hash\n"
    )
    sign = [
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
    ]
    _openssl(
        directory, *sign, "-out", "server.pem", "-days", "2", "-extfile", "server.ext"
    )
    return directory / "ca.pem"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Tinyproxy:
    """tinyproxy on 127.0.0.1:`port` in the foreground (`-d`), its log in `log`; stop() ends it."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("tinyproxy") or "/usr/bin/tinyproxy"
        self.port = free_port()
        self.log = directory / "tinyproxy.log"
        config = directory / "tinyproxy.conf"
        # no ConnectPort line: CONNECT to any port
        config.write_text(
            f'Port {self.port}\nListen 127.0.0.1\nTimeout 60\nLogFile "{self.log}"\nLogLevel Info\n'
            "MaxClients 50\nAllow 127.0.0.1\nDisableViaHeader Yes\n"
        )
        self.process = subprocess.Popen(
            [binary, "-d", "-c", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"tinyproxy did not start: {self.text()[-2000:]}"
                    ) from None
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def connects(self, target: str) -> int:
        """How many CONNECT requests to `target` ("127.0.0.1:PORT") the proxy has logged."""
        return self.text().count(f"CONNECT {target} ")

    def stop(self) -> None:
        end(self.process, 5)

    def __enter__(self) -> Tinyproxy:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()
