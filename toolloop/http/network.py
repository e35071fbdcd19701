"""How a provider's HTTP reaches its host: through which proxy, trusting which certificates.

`Network(proxy=None, verify=None, trust_env=True)`, given to an HTTP client (`HttpxClient(network=...)`,
`KeepAliveClient(network=...)`), so each provider can have its own:

    proxy       every request through this proxy URL (`http://host:3128`, credentials in it if
                any); https goes through it by a CONNECT tunnel. None: the environment's, when
                `trust_env`: `https_proxy` / `HTTPS_PROXY` for https, `http_proxy` / `HTTP_PROXY`
                for http, else `all_proxy`; `no_proxy` / `NO_PROXY` (a comma list of hosts and
                domain suffixes, `host:port`, `*` for all) names the hosts reached directly, an
                explicit proxy included (curl's rules; the variables are read by the standard
                library's `urllib.request.getproxies_environment`).
    verify      the certificates trusted for TLS: an `ssl.SSLContext`, or the path of a PEM bundle
                (a file) or of a hashed certificate directory. None: httpx's default context
                (`httpx.create_ssl_context`), which, when `trust_env`, is `SSL_CERT_FILE`, else
                `SSL_CERT_DIR`, else certifi's bundle -- what httpx, and so the official SDKs, do.
    trust_env   False: no proxy or CA from the environment.

The environment is read once per `Network` (`proxy_for` keeps its answer per origin), so a
long-lived worker pays a dict lookup per call; the SSL context is built once (~10 ms of CPU).
"""

from __future__ import annotations

import os
import ssl
import threading
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from toolloop.errors import PromptGenError


@dataclass(frozen=True, eq=False)
class Network:
    """A provider's proxy and trusted certificates (module docstring)."""

    proxy: str | None = None
    verify: ssl.SSLContext | str | None = None
    trust_env: bool = True
    _cache: dict[str, object] = field(default_factory=dict, init=False, repr=False)
    _tls: list[ssl.SSLContext] = field(default_factory=list, init=False, repr=False)
    _lock: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False
    )

    def proxy_for(self, url: str) -> str | None:
        """The proxy URL to send `url` through, or None to reach its host directly (kept per URL:
        a provider calls the same few)."""
        # `self`: not decided yet (None is an answer)
        found = self._cache.get(url, self)
        if found is self:
            parts = urlsplit(url)
            found = self._decide(parts.scheme, parts.hostname or "", parts.port)
            if len(self._cache) > 1024:
                self._cache.clear()
            self._cache[url] = found
        assert found is None or isinstance(found, str)
        return found

    def _decide(self, scheme: str, host: str, port: int | None) -> str | None:
        proxies = urllib.request.getproxies_environment() if self.trust_env else {}
        chosen = self.proxy or proxies.get(scheme) or proxies.get("all")
        if not chosen:
            return None
        if _bypassed(host, port, proxies.get("no", "")):
            return None
        return chosen

    def ssl_context(self) -> ssl.SSLContext:
        """The SSL context of this network's TLS connections, built once."""
        with self._lock:
            if not self._tls:
                self._tls.append(self._context())
            return self._tls[0]

    def _context(self) -> ssl.SSLContext:
        verify = self.verify
        if isinstance(verify, ssl.SSLContext):
            return verify
        try:
            if isinstance(verify, str):
                if os.path.isdir(verify):
                    return ssl.create_default_context(capath=verify)
                return ssl.create_default_context(cafile=verify)
            return httpx.create_ssl_context(trust_env=self.trust_env)
        except (OSError, ssl.SSLError) as error:
            named = repr(verify) if verify is not None else _named_env()
            raise PromptGenError(
                f"the certificates to trust, {named}, cannot be read ({type(error).__name__}: {error}).\n"
                "  Point it at a PEM file (or a hashed directory) of the CAs to trust, or unset it."
            ) from None


def _bypassed(host: str, port: int | None, no_proxy: str) -> bool:
    """`host` is reached directly by `no_proxy`: `*`, the host, a domain it is in (`example.com`
    or `.example.com` for `api.example.com`), or `host:port` for that port only (curl's rules)."""
    host = host.lower().rstrip(".")
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if entry == "*":
            return True
        name, _, only = (
            entry.partition(":") if not entry.startswith("[") else (entry, "", "")
        )
        if only and (port is None or only != str(port)):
            continue
        name = name.lstrip(".").rstrip(".")
        if name and (host == name or host.endswith("." + name)):
            return True
    return False


def _named_env() -> str:
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        if os.environ.get(name):
            return f"{name}={os.environ[name]!r}"
    return "certifi's bundle"
