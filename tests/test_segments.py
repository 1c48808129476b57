from gateway.segments import split_message


def test_short_replies_stay_whole():
    assert split_message("  Hello there.  ") == ["Hello there."]
    assert split_message("   ") == []


def test_long_replies_split_at_paragraphs_then_sentences_within_the_limit():
    paragraph = " ".join(f"Sentence number {i} is here." for i in range(30))
    text = f"{paragraph}\n\n{paragraph}"
    parts = split_message(text, limit=300)
    assert all(len(p) <= 300 for p in parts)
    assert all(p.endswith(".") for p in parts)  # never cut mid-sentence when sentences fit
    assert " ".join(" ".join(parts).split()) == " ".join(text.split())  # nothing lost


def test_a_word_longer_than_the_limit_is_cut_not_dropped():
    url = "https://example.org/" + "x" * 50
    parts = split_message(f"See {url} now.", limit=20)
    assert all(len(p) <= 20 for p in parts)
    assert "".join(parts).replace(" ", "") == f"See{url}now."
