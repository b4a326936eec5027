"""stream_text: stop strings cut the output and close the token stream."""

from meshnet.client.text import stream_text

VOCAB = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "\n", 6: "User", 7: ":", 8: " bye"}


def decode(ids):
    return "".join(VOCAB[i] for i in ids)


class TokenStream:
    """A test fake of a token generator that records whether it was closed."""

    def __init__(self, ids):
        self.ids, self.closed, self.consumed = ids, False, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.consumed == len(self.ids):
            raise StopIteration
        self.consumed += 1
        return self.ids[self.consumed - 1]

    def close(self):
        self.closed = True


def test_plain_stream_concatenates_to_the_full_text():
    assert "".join(stream_text(iter([1, 2, 3, 4]), decode)) == "Hello world"


def test_stop_string_cuts_and_closes_the_stream():
    tokens = TokenStream([1, 2, 3, 4, 5, 6, 7, 8])
    out = "".join(stream_text(tokens, decode, stop_strings=["\nUser:"]))
    assert out == "Hello world"
    assert tokens.closed and tokens.consumed == 7  # stopped right after the stop string completed


def test_stop_string_spanning_tokens_is_never_emitted():
    pieces = list(stream_text(iter([1, 2, 5, 6, 7, 8]), decode, stop_strings=["\nUser"]))
    assert "".join(pieces) == "Hello" and all("\n" not in p for p in pieces)
