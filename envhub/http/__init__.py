"""What every envhub HTTP server shares, beneath the rollout service and the gateway: request limits and checks
(:mod:`~envhub.http.limits`: body and head caps, deadlines, content type, same-origin, the connection cap) and
running a server (:mod:`~envhub.http.server`: binding rules, sockets, the descriptor limit, the server thread).
Imports nothing of envhub's servers."""
