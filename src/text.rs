//! Text cut to a byte budget on a character boundary: one rule for every place that shortens what it shows or stores (each keeps its own marker).

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
pub fn head(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::head;

    #[test]
    fn a_cut_never_splits_a_character() {
        assert_eq!(head("abc", 5), "abc");
        assert_eq!(head("abc", 2), "ab");
        // "é" is two bytes: a budget ending inside it keeps the text before it.
        assert_eq!(head("aé", 2), "a");
        assert_eq!(head("aé", 3), "aé");
    }
}
