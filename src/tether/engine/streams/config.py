import sys
R = [("""    if old.allow_msg_counter != new.allow_msg_counter:
        raise errors.invalid_stream_config(
            "stream configuration update can not change message counter setting"
        )
    if old.allow_msg_schedules and not new.allow_msg_schedules:
        raise errors.invalid_stream_config("message schedules can not be disabled")
    if old.allow_msg_ttl and not new.allow_msg_ttl:
        raise errors.invalid_stream_config("message TTL status can not be disabled")
""", """    if old.allow_msg_ttl and not new.allow_msg_ttl:
        raise errors.invalid_stream_config("message TTL status can not be disabled")
    if old.allow_msg_counter != new.allow_msg_counter:
        raise errors.invalid_stream_config(
            "stream configuration update can not change message counter setting"
        )
    if old.allow_msg_schedules and not new.allow_msg_schedules:
        raise errors.invalid_stream_config("message schedules can not be disabled")
""")]
def apply(text):
    for old, new in R:
        n = text.count(old)
        if n != 1:
            raise SystemExit(f"anchor found {n} times: {old[:80]!r}")
        text = text.replace(old, new)
    return text
if __name__ == "__main__":
    src = open(sys.argv[1]).read()
    out = apply(src)
    with open(sys.argv[2] if len(sys.argv) > 2 else sys.argv[1], "w") as fh:
        fh.write(out)
