"""Planner specs shared by tests."""

# An encoder E (0.5 s per image request) and an LLM L (0.25 s per request), profiled at 90 % text:
# E serves 20 requests of the mix per second (1 in 10 needs it), L 4.
ENCODER_LLM = {
    "components": ["E", "L"],
    "options": [
        {"name": "E", "components": ["E"], "gpus": 1, "throughput": 20.0},
        {"name": "L", "components": ["L"], "gpus": 1, "throughput": 4.0},
    ],
    "request_types": [
        {"name": "text", "components": ["L"], "share": 0.9},
        {"name": "image+text", "components": ["E", "L"], "share": 0.1},
    ],
}
