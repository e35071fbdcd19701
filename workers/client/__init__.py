"""What a web backend imports: `Client`, `AsyncClient` and their sharded forms (docs/workers.md)."""

from workers.client.aio import AsyncClient
from workers.client.shards import AsyncShardedClient, ShardedClient
from workers.client.sync import Client

__all__ = ["AsyncClient", "AsyncShardedClient", "Client", "ShardedClient"]
