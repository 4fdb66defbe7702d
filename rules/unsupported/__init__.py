"""UNS: code the NPU cannot run as it is, reported for a person."""
