"""The only layer that touches a device: launch, check, bench, profile, sanitize, isolated workers."""
