"""Sensor drivers: serial (Modbus RTU, line protocols) and MQTT bridge, each a WAMP client."""
