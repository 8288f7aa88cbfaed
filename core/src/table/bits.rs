//! Per-(client, slot) relations as fixed bit grids: one row per client slot, `BITS` bits per
//! lock or object.
//!
//! A grid answers "does client c hold a reference to lock l" in one load, and "what does client
//! c hold" by scanning its row a word at a time, which is what cleanup after a client's death
//! needs. The worst case (every client referencing every lock) is the size, so nothing can fill.

/// A `rows × cols` grid of `BITS`-bit entries over caller memory.
#[derive(Debug)]
pub struct BitGrid<'r, const BITS: u32> {
    words: &'r mut [u64],
    row_words: usize,
    cols: u32,
}

impl<'r, const BITS: u32> BitGrid<'r, BITS> {
    const PER_WORD: u32 = 64 / BITS;
    const MASK: u64 = (1 << BITS) - 1;

    /// Wraps zeroed memory of `rows × words_for(cols, BITS)` words.
    pub fn new(words: &'r mut [u64], cols: u32) -> Self {
        let row_words = crate::table::layout::words_for(cols, BITS as usize);
        assert!(
            row_words > 0 && words.len().is_multiple_of(row_words),
            "sized by Layout"
        );
        Self {
            words,
            row_words,
            cols,
        }
    }

    #[inline]
    fn at(&self, row: u32, col: u32) -> (usize, u32) {
        debug_assert!(col < self.cols);
        let word = row as usize * self.row_words + (col / Self::PER_WORD) as usize;
        (word, (col % Self::PER_WORD) * BITS)
    }

    /// The entry at (`row`, `col`).
    #[inline]
    pub fn get(&self, row: u32, col: u32) -> u8 {
        let (w, shift) = self.at(row, col);
        ((self.words[w] >> shift) & Self::MASK) as u8
    }

    /// Sets the entry at (`row`, `col`) to `value` (only the low `BITS` bits are kept).
    /// Always inlined: the data path sets a holds entry on nearly every command, and left to
    /// the compiler it was a call each time.
    #[inline(always)]
    pub fn set(&mut self, row: u32, col: u32, value: u8) {
        let (w, shift) = self.at(row, col);
        let word = &mut self.words[w];
        *word = (*word & !(Self::MASK << shift)) | ((value as u64 & Self::MASK) << shift);
    }

    /// The first non-zero entry of `row` at or after column `from`, as `(col, value)`.
    pub fn next_in_row(&self, row: u32, from: u32) -> Option<(u32, u8)> {
        if from >= self.cols {
            return None;
        }
        let base = row as usize * self.row_words;
        let mut word_i = (from / Self::PER_WORD) as usize;
        // Mask off entries before `from` in the first word.
        let mut word = self.words[base + word_i] & (!0u64 << ((from % Self::PER_WORD) * BITS));
        loop {
            if word != 0 {
                let entry = word.trailing_zeros() / BITS;
                let col = word_i as u32 * Self::PER_WORD + entry;
                let value = ((word >> (entry * BITS)) & Self::MASK) as u8;
                return (col < self.cols).then_some((col, value));
            }
            word_i += 1;
            if word_i == self.row_words {
                return None;
            }
            word = self.words[base + word_i];
        }
    }

    /// Zeroes a whole row (a client slot being freed).
    pub fn clear_row(&mut self, row: u32) {
        let base = row as usize * self.row_words;
        self.words[base..base + self.row_words].fill(0);
    }

    /// The raw words (for digests).
    pub fn words(&self) -> impl Iterator<Item = u64> + '_ {
        self.words.iter().copied()
    }

    /// Number of rows.
    pub fn rows(&self) -> u32 {
        (self.words.len() / self.row_words) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_independent_and_rows_scan_in_order() {
        let cols = 70; // spans two words at 1 bit, three at 2 bits
        let mut mem = vec![0u64; 3 * crate::table::layout::words_for(cols, 2)];
        let mut g = BitGrid::<2>::new(&mut mem, cols);
        g.set(1, 0, 3);
        g.set(1, 33, 1);
        g.set(1, 69, 2);
        g.set(2, 5, 1);
        assert_eq!(g.get(1, 33), 1);
        assert_eq!(g.get(0, 33), 0);
        assert_eq!(g.next_in_row(1, 0), Some((0, 3)));
        assert_eq!(g.next_in_row(1, 1), Some((33, 1)));
        assert_eq!(g.next_in_row(1, 34), Some((69, 2)));
        assert_eq!(g.next_in_row(1, 70), None);
        g.set(1, 33, 0);
        assert_eq!(g.next_in_row(1, 1), Some((69, 2)));
        g.clear_row(1);
        assert_eq!(g.next_in_row(1, 0), None);
        assert_eq!(g.next_in_row(2, 0), Some((5, 1)));
    }
}
