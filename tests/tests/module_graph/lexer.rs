//! Rust source to token trees: just enough lexing to find items, `use` trees and paths.
//!
//! Comments, string/char literals and lifetimes are dropped or made opaque so that words
//! inside them are never mistaken for names.

/// One token tree: a bracketed group is a single tree, so an item's end is easy to find.
#[derive(Debug, Clone, PartialEq)]
pub enum Tree {
    Ident(String),
    /// A punctuation token: one character, or `::`.
    Punct(&'static str),
    /// A literal or lifetime: never a name.
    Opaque,
    Group(Delim, Vec<Tree>),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Delim {
    Paren,
    Bracket,
    Brace,
}

impl Tree {
    pub fn is_ident(&self, word: &str) -> bool {
        matches!(self, Tree::Ident(w) if w == word)
    }

    pub fn is_punct(&self, p: &str) -> bool {
        matches!(self, Tree::Punct(q) if *q == p)
    }
}

/// Tokenizes `src` and nests its brackets; an error says what is unbalanced and where.
pub fn parse_trees(src: &str) -> Result<Vec<Tree>, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut stack: Vec<(Delim, Vec<Tree>, usize)> = Vec::new();
    let mut top: Vec<Tree> = Vec::new();
    let mut i = 0;
    let mut line = 1;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\n' {
            line += 1;
        }
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i = skip_block_comment(&chars, i, &mut line)?;
        } else if let Some(end) = string_literal_end(&chars, i) {
            line += chars[i..end].iter().filter(|&&c| c == '\n').count();
            top.push(Tree::Opaque);
            i = end;
        } else if c == '\'' || (c == 'b' && next == Some('\'')) {
            i = skip_char_or_lifetime(&chars, i);
            top.push(Tree::Opaque);
        } else if c == 'r'
            && next == Some('#')
            && chars.get(i + 2).is_some_and(|&c| is_ident_start(c))
        {
            let start = i + 2;
            i = start;
            while i < chars.len() && is_ident_continue(chars[i]) {
                i += 1;
            }
            top.push(Tree::Ident(chars[start..i].iter().collect()));
        } else if is_ident_start(c) {
            let start = i;
            while i < chars.len() && is_ident_continue(chars[i]) {
                i += 1;
            }
            top.push(Tree::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit() {
            while i < chars.len()
                && (is_ident_continue(chars[i])
                    || (chars[i] == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)))
            {
                i += 1;
            }
            top.push(Tree::Opaque);
        } else if let Some(delim) = open_delim(c) {
            stack.push((delim, std::mem::take(&mut top), line));
            i += 1;
        } else if let Some(delim) = close_delim(c) {
            let Some((open, outer, _)) = stack.pop() else {
                return Err(format!("line {line}: unmatched `{c}`"));
            };
            if open != delim {
                return Err(format!("line {line}: `{c}` closes a {open:?} group"));
            }
            let inner = std::mem::replace(&mut top, outer);
            top.push(Tree::Group(delim, inner));
            i += 1;
        } else if c == ':' && next == Some(':') {
            top.push(Tree::Punct("::"));
            i += 2;
        } else {
            top.push(Tree::Punct(punct_str(c)));
            i += 1;
        }
    }
    if let Some((delim, _, open_line)) = stack.pop() {
        return Err(format!("line {open_line}: {delim:?} group is never closed"));
    }
    Ok(top)
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

fn open_delim(c: char) -> Option<Delim> {
    match c {
        '(' => Some(Delim::Paren),
        '[' => Some(Delim::Bracket),
        '{' => Some(Delim::Brace),
        _ => None,
    }
}

fn close_delim(c: char) -> Option<Delim> {
    match c {
        ')' => Some(Delim::Paren),
        ']' => Some(Delim::Bracket),
        '}' => Some(Delim::Brace),
        _ => None,
    }
}

/// The punctuation this checker looks at, by name; every other character is `?`.
fn punct_str(c: char) -> &'static str {
    match c {
        '#' => "#",
        '!' => "!",
        ';' => ";",
        ',' => ",",
        '*' => "*",
        '.' => ".",
        '<' => "<",
        '$' => "$",
        ':' => ":",
        '=' => "=",
        _ => "?",
    }
}

fn skip_block_comment(chars: &[char], mut i: usize, line: &mut usize) -> Result<usize, String> {
    let start_line = *line;
    let mut depth = 0;
    while i < chars.len() {
        match (chars[i], chars.get(i + 1)) {
            ('/', Some('*')) => {
                depth += 1;
                i += 2;
            }
            ('*', Some('/')) => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return Ok(i);
                }
            }
            (c, _) => {
                if c == '\n' {
                    *line += 1;
                }
                i += 1;
            }
        }
    }
    Err(format!("line {start_line}: block comment is never closed"))
}

/// The end of a (byte, C, raw) string literal starting at `i`, or `None` if none starts there.
fn string_literal_end(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    // Prefixes: b, c, r, br, cr.
    if matches!(chars.get(j), Some('b') | Some('c')) {
        j += 1;
    }
    let raw = chars.get(j) == Some(&'r');
    if raw {
        j += 1;
    }
    let mut hashes = 0;
    if raw {
        while chars.get(j) == Some(&'#') {
            hashes += 1;
            j += 1;
        }
    }
    if chars.get(j) != Some(&'"') {
        return None;
    }
    // `br` alone (no quote) was rejected above; a plain identifier like `b` never reaches here.
    j += 1;
    while j < chars.len() {
        match chars[j] {
            '\\' if !raw => j += 2,
            '"' => {
                let closing = (1..=hashes).all(|k| chars.get(j + k) == Some(&'#'));
                if closing {
                    return Some(j + 1 + hashes);
                }
                j += 1;
            }
            _ => j += 1,
        }
    }
    Some(chars.len())
}

/// Skips a char literal (`'a'`, `'\n'`, `b'x'`) or a lifetime (`'a`, `'static`).
fn skip_char_or_lifetime(chars: &[char], mut i: usize) -> usize {
    if chars[i] == 'b' {
        i += 1;
    }
    // chars[i] == '\''
    if chars.get(i + 1) == Some(&'\\') {
        let mut j = i + 2;
        while j < chars.len() && !(chars[j] == '\'' && j > i + 2) {
            j += 1;
        }
        return j + 1;
    }
    if chars.get(i + 2) == Some(&'\'') {
        return i + 3;
    }
    let mut j = i + 1;
    while j < chars.len() && is_ident_continue(chars[j]) {
        j += 1;
    }
    j
}
