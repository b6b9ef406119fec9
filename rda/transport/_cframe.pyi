# The compiled fast path of protocol.decode_frames for REQUEST/REPLY (_cframe.pyx).
from rda.serialization.message import Message

def parse_message(frames: list[object], kind: int, max_size: int) -> Message | None: ...
