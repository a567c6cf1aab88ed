"""Runs inside the sandbox: ``127.0.0.1:PORT`` -> the gateway's Unix socket (bound in read-only).

The sandbox has no network but its own loopback; the harness sees an ordinary base URL and can reach nothing but
the gateway's model routes. Standard library only (it runs on whatever python3 the sandbox has).

    python3 forwarder.py PORT SOCKET_PATH
"""
import asyncio
import sys


async def _pipe(reader, writer):
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _serve(port, path):
    async def handle(reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(path)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print("envhub-forwarder ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1]), sys.argv[2]))
