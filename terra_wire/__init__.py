"""The messages on the wire and their codecs, without I/O: the coflow API (client <->
controller), the control channel (agent <-> controller) and the overlay's frames (agent <->
agent). No event loop and no sockets: controller, agents and clients share it.
Layers: docs/architecture.md."""
