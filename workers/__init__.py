"""toolloop's durable runs, in rooms by role; each imports only the rooms below it (`make lint`).

tasks.py, app.py  the Celery tasks and app: `celery -A workers.app worker`      worker
worker/    bootsteps, the step consumer, its queue, the poison guard, remote control  worker
step/      one step: begin, run, commit, publish; the model call's wrappers     worker
flow/      rate limits and accounts around model calls and tools               worker
process/   what one worker process owns: leases, deadlines, live loops, Redis I/O  worker
runs/      a run's lifecycle: answers, cancels, the outbox, the sweeper, approvals  both
client/    Client, AsyncClient, ShardedClient: what a web backend imports       client
config/    settings, the Celery configuration, toolsets, MCP servers, rate limits  both
testing/   kill points (loaded when a kill plan is set)                         tests
observe/   metrics, tracing, observation hooks                                  both
protocol/  names, keys, the Celery wire, the run spec, errors, every Lua script  both
"""
