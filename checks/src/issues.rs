//! Finds comments that record an issue number. A comment says why the code is as it is; the
//! tracker's number says where that was once discussed, which a reader of the code cannot
//! follow and which goes stale when the tracker moves. Two shapes count as a citation (`N`
//! stands for digits here, so that this comment passes its own check; the tests spell them
//! out):
//!
//! - `#` and digits standing alone: `#N`, `(#N)`, `issue #N`, `PR #N`. The `#` must not
//!   follow a letter, digit, `_`, `&` or `#` (so `alpha#0`, `&#39;` and `##1` are not
//!   citations) and the digits must not run into a letter or `_` (so `#0f0` is not); a `#`
//!   followed by anything else (`#[derive]`, `# Examples`) never is.
//! - the word `issue` or `issues`, a space, and a number, ending the phrase (`issue N`,
//!   `(issue N)`, `issue N:`) or followed by `item`, `items`, `and` or `or` (`issue N item
//!   M`). A number followed by another word is the verb (`issue 2 PATs`, `issues 100,000 of
//!   them`), and a number with a thousands separator or a decimal point is a count.
//!
//! Numbers without either shape (`404`, `HTTP 429`, `session 21`, `RFC 3339`) are left alone.

/// The citations of an issue number in `text` (a comment's text), as the words that make each.
pub fn citations(text: &str) -> Vec<String> {
    let mut out = hash_numbers(text);
    out.extend(issue_words(text));
    out
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `#N`-shaped citations.
fn hash_numbers(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices('#') {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| is_word(c) || c == '&' || c == '#') {
            continue;
        }
        let rest = &text[at + 1..];
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        if digits == 0 || rest[digits..].chars().next().is_some_and(is_word) {
            continue;
        }
        out.push(text[at..at + 1 + digits].to_string());
    }
    out
}

/// Words that may follow an issue's number in a citation (`issue N item M`).
const FOLLOWERS: &[&str] = &["item", "items", "and", "or"];

/// `issue N`-shaped citations.
fn issue_words(text: &str) -> Vec<String> {
    let lower = text.to_lowercase();
    if lower.len() != text.len() {
        // Lower-casing changed byte offsets (a rare letter): read the text as it is.
        return issue_words_in(text, text);
    }
    issue_words_in(text, &lower)
}

fn issue_words_in(text: &str, lower: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in lower.match_indices("issue") {
        if lower[..at].chars().next_back().is_some_and(is_word) {
            continue;
        }
        let mut rest = &lower[at + "issue".len()..];
        rest = rest.strip_prefix('s').unwrap_or(rest);
        let Some(after_space) = rest.strip_prefix(' ') else { continue };
        let digits = after_space.chars().take_while(char::is_ascii_digit).count();
        if digits == 0 {
            continue;
        }
        let tail = &after_space[digits..];
        let mut next = tail.chars();
        let ends = match next.next() {
            None => true,
            Some(c) if is_word(c) => false,
            // `100,000` or `1.5`: a count or a measure, not a number in a tracker.
            Some(',' | '.') if next.next().is_some_and(|c| c.is_ascii_digit()) => false,
            Some(' ') => {
                let word: String = tail[1..].chars().take_while(|&c| is_word(c)).collect();
                word.is_empty() || FOLLOWERS.contains(&word.as_str())
            }
            Some(_) => true,
        };
        if ends {
            let end = text.len() - tail.len();
            out.push(text[at..end].to_string());
        }
    }
    out
}

/// The comments of a file whose comments start with `#` (shell, YAML, TOML, Python,
/// Dockerfile), with everything else blanked, lines kept: a `#` at a line's start or after
/// whitespace starts a comment that runs to the line's end. Not a parser of those languages:
/// a quoted ` #` would be read as a comment, which for this check only errs towards flagging.
pub fn hash_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (n, line) in text.split('\n').enumerate() {
        if n > 0 {
            out.push('\n');
        }
        let start = line.char_indices().find(|&(i, c)| c == '#' && (i == 0 || line[..i].ends_with([' ', '\t'])));
        match start {
            Some((i, _)) => {
                out.extend(std::iter::repeat_n(' ', line[..i].chars().count()));
                out.push_str(&line[i..]);
            }
            None => out.extend(std::iter::repeat_n(' ', line.chars().count())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue_numbers_in_their_usual_shapes_are_citations() {
        for (text, want) in [
            ("see issue 62", vec!["issue 62"]),
            ("(#61) keeps it", vec!["#61"]),
            ("issue #60: the budget", vec!["#60"]),
            ("as Issue 62 item 7 asks", vec!["Issue 62"]),
            ("issues #7, #16", vec!["#7", "#16"]),
            ("PR #12 and #13.", vec!["#12", "#13"]),
            ("from issue 19.", vec!["issue 19"]),
            ("#4", vec!["#4"]),
        ] {
            let mut got = citations(text);
            got.sort();
            let mut want: Vec<String> = want.into_iter().map(String::from).collect();
            want.sort();
            assert_eq!(got, want, "{text}");
        }
    }

    #[test]
    fn numbers_that_cite_no_issue_are_left_alone() {
        for text in [
            "answers 404, then 429 (HTTP 429 Too Many Requests)",
            "#[derive(Debug)] and # Examples",
            "alpha#0 → n-a; &#39; in HTML; ##1",
            "colour #0f0",
            "the controller may issue 2 PATs",
            "convergence issues 100,000 of them",
            "issue 1.5 times",
            "RFC 3339, session 21, step 3",
            "reissue 3",
            "an issue #-less note",
        ] {
            assert_eq!(citations(text), Vec::<String>::new(), "{text}");
        }
    }

    #[test]
    fn hash_comments_keep_only_the_comment() {
        let got = hash_comments("a: 1 # issue 9\nb: \"x#1\"\n# top\n");
        assert_eq!(got, "     # issue 9\n        \n# top\n");
    }
}
