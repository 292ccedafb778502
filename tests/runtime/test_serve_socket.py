"""The listening socket every service binds (`relay_runtime.serve.bind_socket`)."""

from __future__ import annotations

import asyncio
import socket

from relay_runtime.serve import bind_socket


def test_accepted_connections_have_nodelay() -> None:
    """Regression: bound without IPPROTO_TCP, asyncio left TCP_NODELAY off on accepted
    connections, and each response's second segment waited 40 ms for a delayed ACK."""

    async def accept_one() -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def connected(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        listening = bind_socket("127.0.0.1", 0)
        server = await asyncio.start_server(connected, sock=listening)
        port = listening.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            return await asyncio.wait_for(accepted, 5)
        finally:
            writer.close()
            server.close()

    assert asyncio.run(accept_one()) == 1
