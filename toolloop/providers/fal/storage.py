"""fal storage uploads for the images of a request (PROVIDERS.md, fal section).

Each image file is uploaded once: `POST {upload_url}` with `{file_name, content_type}` answers
`{upload_url, file_url}`, then `PUT` of the bytes to that `upload_url`; at most 4 uploads at a
time. The URL is cached by `storage:<mime>:<sha256 of the bytes>` in `UrlCache`, an LRU kept on the
handler (never module state), so the same image gets the same URL every step and a cached prompt
prefix still matches. An upload that fails is sent as a `data:<mime>;base64,...` URI instead, and
that choice is cached too (the same image keeps the same URI on the next step).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import threading
from collections import OrderedDict
from pathlib import Path

import httpx

from toolloop.contract import ImagePart
from toolloop.http.httpx_client import open_httpx
from toolloop.http.network import Network
from toolloop.providers.common import read_image

log = logging.getLogger("toolloop.providers.fal")

DEFAULT_UPLOAD_URL = (
    "https://rest.alpha.fal.ai/storage/upload/initiate?storage_type=fal-cdn-v3"
)
CONCURRENT_UPLOADS = 4
_DATA = ""  # cached marker: this image is sent as a data URI (its upload failed)


class UrlCache:
    """A bounded LRU of `storage:<mime>:<sha256>` -> file URL (or the data-URI marker)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._items: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> str | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: str, url: str) -> None:
        with self._lock:
            self._items[key] = url
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


async def image_urls(
    parts: list[ImagePart],
    *,
    cache: UrlCache,
    upload_url: str | None,
    key: str,
    timeout_s: float,
    transport: httpx.AsyncBaseTransport | None,
    provider: str = "fal",
    network: Network | None = None,
) -> dict[str, str]:
    """The URL to send for the file of every part, by path. `upload_url` None: data URIs only.
    `network`: the proxy and certificates (the model calls'; the proxy is the upload URL's)."""
    mimes = {part.path: part.mime_type for part in parts}
    if not mimes:
        return {}
    paths = sorted(mimes)
    contents = await asyncio.gather(
        *(asyncio.to_thread(_read, provider, p) for p in paths)
    )
    urls: dict[str, str] = {}
    todo: list[tuple[str, str, bytes]] = []
    for path, data in zip(paths, contents, strict=True):
        cache_key = f"storage:{mimes[path]}:{hashlib.sha256(data).hexdigest()}"
        found = cache.get(cache_key) if upload_url is not None else _DATA
        if found is None:
            todo.append((path, cache_key, data))
        else:
            urls[path] = found or _data_uri(mimes[path], data)
    if todo:
        assert upload_url is not None
        limit = asyncio.Semaphore(CONCURRENT_UPLOADS)
        network = network or Network()
        proxy = None if transport is not None else network.proxy_for(upload_url)
        async with open_httpx(
            network, proxy=proxy, transport=transport, timeout=timeout_s
        ) as client:

            async def one(path: str, cache_key: str, data: bytes) -> None:
                async with limit:
                    url = await _upload(
                        client, upload_url, key, path, mimes[path], cache_key, data
                    )
                cache.put(cache_key, url)
                urls[path] = url or _data_uri(mimes[path], data)

            await asyncio.gather(*(one(*item) for item in todo))
    return urls


async def _upload(
    client: httpx.AsyncClient,
    upload_url: str,
    key: str,
    path: str,
    mime: str,
    cache_key: str,
    data: bytes,
) -> str:
    """The file URL, or the data-URI marker when the upload failed (logged)."""
    name = cache_key.rsplit(":", 1)[1][:16] + Path(path).suffix
    try:
        started = await client.post(
            upload_url,
            json={"file_name": name, "content_type": mime},
            headers={"authorization": f"Key {key}"},
        )
        started.raise_for_status()
        answer = started.json()
        target, file_url = answer["upload_url"], answer["file_url"]
        if not (isinstance(target, str) and isinstance(file_url, str)):
            raise ValueError("upload_url and file_url must be strings")
        put = await client.put(target, content=data, headers={"content-type": mime})
        put.raise_for_status()
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        status = (
            exc.response.status_code if isinstance(exc, httpx.HTTPStatusError) else None
        )
        log.warning(
            "fal storage upload of %s failed (%s); sending it as a data URI",
            path,
            f"HTTP {status}" if status else type(exc).__name__,
        )
        return _DATA
    return file_url


def _data_uri(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _read(provider: str, path: str) -> bytes:
    return read_image(provider, path)
