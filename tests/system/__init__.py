"""Real sockets and processes: routers, clients, drivers, the cairn command, Mosquitto, HTTP
servers, on loopback."""
