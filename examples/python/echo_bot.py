"""botmesh from Python through its C ABI (ctypes, standard library only).

Builds one bot with an exclusive transport ("py-phone") on an in-process
coordinator, delivers messages through the transport's session as a polling loop
would, answers them with a handler written in Python, prints the Prometheus metrics
text, and stops. Exits with status 0 when every message was answered once and in
order per chat.

    cargo rustc --release --features ffi --crate-type cdylib --lib
    python3 examples/python/echo_bot.py target/release/libbotmesh.so

The library path may also come from BOTMESH_LIB. ctypes takes the GIL around each
callback, so the handler (on the bot's worker threads) and the transport's start
and stop (on its leadership thread) may touch Python objects; they must not raise
(an exception is printed and the callback answers as failed).
"""

import ctypes
import os
import sys
import threading

MESSAGES_PER_CHAT = 5
CHATS = ["chat-a", "chat-b"]

# Status codes and session states (include/botmesh.h).
BOTMESH_OK = 0
BOTMESH_INVALID = 1
BOTMESH_SESSION_OPEN = 1

c_void_p = ctypes.c_void_p
HANDLER = ctypes.CFUNCTYPE(ctypes.c_int, c_void_p, c_void_p)
SEND = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, c_void_p)
START = ctypes.CFUNCTYPE(ctypes.c_int, c_void_p, c_void_p)
STOP = ctypes.CFUNCTYPE(None, c_void_p)


class Provider(ctypes.Structure):
    """struct botmesh_provider."""

    _fields_ = [("start", START), ("stop", STOP), ("send", SEND)]


def load(path):
    lib = ctypes.CDLL(path)
    sigs = {
        "botmesh_error_new": ([], c_void_p),
        "botmesh_error_message": ([c_void_p], ctypes.c_char_p),
        "botmesh_error_free": ([c_void_p], None),
        "botmesh_config_new": ([ctypes.c_char_p, c_void_p], c_void_p),
        "botmesh_config_free": ([c_void_p], None),
        "botmesh_builder_new": (
            [ctypes.c_char_p, ctypes.c_uint32, c_void_p, HANDLER, SEND, c_void_p, c_void_p, c_void_p],
            c_void_p,
        ),
        "botmesh_builder_add_provider": (
            [c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(Provider), c_void_p, c_void_p],
            ctypes.c_int,
        ),
        "botmesh_builder_build": ([c_void_p, c_void_p], c_void_p),
        "botmesh_bot_deliver": (
            [c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, c_void_p],
            ctypes.c_int,
        ),
        "botmesh_bot_stop": ([c_void_p, c_void_p], ctypes.c_int),
        "botmesh_bot_free": ([c_void_p], None),
        "botmesh_bot_metrics_text": (
            [c_void_p, ctypes.POINTER(c_void_p), ctypes.POINTER(ctypes.c_size_t), c_void_p],
            ctypes.c_int,
        ),
        "botmesh_string_free": ([c_void_p], None),
        "botmesh_context_chat": ([c_void_p], ctypes.c_char_p),
        "botmesh_context_text": ([c_void_p], ctypes.c_char_p),
        "botmesh_context_fencing_token": ([c_void_p], ctypes.c_uint64),
        "botmesh_context_reply": ([c_void_p, ctypes.c_char_p, c_void_p], ctypes.c_int),
        "botmesh_session_deliver": (
            [c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, c_void_p],
            ctypes.c_int,
        ),
        "botmesh_session_report": ([c_void_p, ctypes.c_int, ctypes.c_char_p, c_void_p], ctypes.c_int),
        "botmesh_session_fencing_token": ([c_void_p], ctypes.c_uint64),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res
    return lib


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("BOTMESH_LIB")
    if not path:
        print("usage: echo_bot.py PATH/TO/libbotmesh.so (or set BOTMESH_LIB)", file=sys.stderr)
        return 2
    lib = load(path)
    err = lib.botmesh_error_new()
    lock = threading.Lock()
    changed = threading.Condition(lock)
    state = {"session": None, "token": 0, "starts": 0, "stops": 0}
    sent = []  # (chat, text) in the order the transport sent them
    seen = {chat: [] for chat in CHATS}

    # The handler: runs on the bot's worker threads, under the chat's turn.
    @HANDLER
    def handle(ctx, _user_data):
        chat = lib.botmesh_context_chat(ctx).decode()
        text = lib.botmesh_context_text(ctx).decode()
        with lock:
            seen[chat].append(text)
        reply = f"echo {text} (token {lib.botmesh_context_fencing_token(ctx)})"
        return 0 if lib.botmesh_context_reply(ctx, reply.encode(), None) == BOTMESH_OK else 1

    # The transport: started on the leader only, on its leadership thread.
    @START
    def start(session, _user_data):
        token = lib.botmesh_session_fencing_token(session)
        lib.botmesh_session_report(session, BOTMESH_SESSION_OPEN, None, None)
        with changed:
            state.update(session=session, token=token, starts=state["starts"] + 1)
            changed.notify_all()
        return 0

    @STOP
    def stop(_user_data):
        with changed:
            state.update(session=None, stops=state["stops"] + 1)
            changed.notify_all()

    @SEND
    def send(chat, text, _user_data):
        with changed:
            sent.append((chat.decode(), text.decode()))
            changed.notify_all()
        return 0

    config = lib.botmesh_config_new(b'{"coordinator": {"memory": {}}}', err)
    if not config:
        print("config:", lib.botmesh_error_message(err).decode(), file=sys.stderr)
        return 2
    builder = lib.botmesh_builder_new(b"py-replica-1", 2, config, handle, SEND(), None, None, err)
    provider = Provider(start, stop, send)
    if not builder or lib.botmesh_builder_add_provider(builder, b"py-phone", 1, provider, None, err) != BOTMESH_OK:
        print("builder:", lib.botmesh_error_message(err).decode(), file=sys.stderr)
        return 2
    bot = lib.botmesh_builder_build(builder, err)
    if not bot:
        print("build:", lib.botmesh_error_message(err).decode(), file=sys.stderr)
        return 2

    failures = []
    # A bad argument is refused with a message naming it.
    if lib.botmesh_bot_deliver(bot, None, None, b"x", err) != BOTMESH_INVALID:
        failures.append("a NULL chat was not refused")
    print("refused as expected:", lib.botmesh_error_message(err).decode())

    with changed:
        if not changed.wait_for(lambda: state["session"] is not None, timeout=10):
            failures.append("the transport was never started")
        session = state["session"]
    print(f"leading py-phone with token {state['token']}")
    total = 0
    if session:
        # As the transport's polling loop would: deliver through its session.
        for i in range(MESSAGES_PER_CHAT):
            for chat in CHATS:
                rc = lib.botmesh_session_deliver(session, chat.encode(), f"{chat}/{i}".encode(), f"msg {i}".encode(), err)
                if rc != BOTMESH_OK:
                    failures.append(f"deliver: {rc} {lib.botmesh_error_message(err).decode()}")
                total += 1
    with changed:
        if not changed.wait_for(lambda: len(sent) >= total, timeout=10):
            failures.append(f"only {len(sent)} of {total} replies")

    out = c_void_p()
    length = ctypes.c_size_t()
    if lib.botmesh_bot_metrics_text(bot, ctypes.byref(out), ctypes.byref(length), err) != BOTMESH_OK:
        failures.append("metrics: " + lib.botmesh_error_message(err).decode())
    else:
        text = ctypes.string_at(out, length.value).decode()
        lib.botmesh_string_free(out)
        shown = [line for line in text.splitlines() if line.startswith(("botmesh_messages", "botmesh_leader"))]
        print("metrics text (excerpt):")
        for line in shown:
            print("  " + line)
        if 'botmesh_leader_election_master_status{name="py-phone"} 1' not in text:
            failures.append("the leader gauge is missing")

    if lib.botmesh_bot_stop(bot, err) != BOTMESH_OK:
        failures.append("stop: " + lib.botmesh_error_message(err).decode())
    lib.botmesh_bot_free(bot)
    lib.botmesh_config_free(config)
    lib.botmesh_error_free(err)

    expected = [f"msg {i}" for i in range(MESSAGES_PER_CHAT)]
    for chat in CHATS:
        if seen[chat] != expected:
            failures.append(f"{chat} handled {seen[chat]}, not {expected} in order")
    if state["starts"] != 1 or state["stops"] != 1:
        failures.append(f"transport started {state['starts']} and stopped {state['stops']} times")
    for f in failures:
        print("FAILED:", f, file=sys.stderr)
    ok = "true" if not failures else "false"
    print(f'{{"replies":{len(sent)},"starts":{state["starts"]},"stops":{state["stops"]},"ok":{ok}}}')
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
