"""Who a client is: its NATS URL, credentials, TLS and inbox (``client``) and the
dashboard's logins (``dashboard``). The server's side is ``allot.ops.auth_gen``."""
