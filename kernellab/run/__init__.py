"""The layer that touches a device or simulates one, split by job: launch/, sim/, nvtools/, measure/, fanout."""
