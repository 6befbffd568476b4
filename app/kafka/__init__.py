"""The Kafka door: Kafka's wire protocol beside the HTTP API, on the same operations and data.

    listener.py         asyncio server: length-prefixed frames, one request at a time per connection
    listener_addresses.py  its HOST:PORT settings, read by `serve` before it imports the door
    frames.py           a frame to (header, request) and a response to a frame, with kio's generated messages
    dispatch.py         the API table (key -> versions, handler) that ApiVersions advertises
    handlers/           one module per API family
    record_batches.py   RecordBatches in (validated, decompressed within a bound) and out (from stored batches)
    broker_calls.py     every call into the application core: the only module here that imports
                        app.coordinator (none imports app.storage: pyproject's import contracts)

Nothing here imports app.api or app.console. docs/kafka.md lists what works with which client.
"""
