//! The little dense linear algebra PowerSGD needs, on row-major f32 slices.
//!
//! A thin factor (n×r) is stored transposed, as `r` contiguous vectors of length n, so every
//! loop below runs over contiguous memory (a dot product or an `axpy`) and vectorises.

/// `Σ a[i]·b[i]`, with independent partial sums so it vectorises.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `y += alpha · x`.
fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    y.iter_mut().zip(x).for_each(|(y, x)| *y += alpha * x);
}

/// `pᵀ (r×n) = (m (n×len) · q)ᵀ` with `q` given as `qt (r×len)`.
pub(crate) fn project(m: &[f32], qt: &[f32], pt: &mut [f32], n: usize, len: usize, r: usize) {
    for k in 0..r {
        let q = &qt[k * len..(k + 1) * len];
        for i in 0..n {
            pt[k * n + i] = dot(&m[i * len..(i + 1) * len], q);
        }
    }
}

/// `qᵀ (r×len) = (mᵀ · p)ᵀ` for `m (n×len)` and `p` given as `pt (r×n)`.
pub(crate) fn project_t(m: &[f32], pt: &[f32], qt: &mut [f32], n: usize, len: usize, r: usize) {
    qt.iter_mut().for_each(|v| *v = 0.0);
    for i in 0..n {
        let row = &m[i * len..(i + 1) * len];
        for k in 0..r {
            axpy(&mut qt[k * len..(k + 1) * len], pt[k * n + i], row);
        }
    }
}

/// `out (n×len) = p · qᵀ` for `p` given as `pt (r×n)` and `q` as `qt (r×len)`.
pub(crate) fn expand(pt: &[f32], qt: &[f32], out: &mut [f32], n: usize, len: usize, r: usize) {
    for i in 0..n {
        let row = &mut out[i * len..(i + 1) * len];
        row.iter_mut().for_each(|v| *v = 0.0);
        for k in 0..r {
            axpy(row, pt[k * n + i], &qt[k * len..(k + 1) * len]);
        }
    }
}

/// Gram-Schmidt on the `r` vectors of length `len` in `a`: orthonormal vectors (one that is zero
/// up to `eps` stays near zero instead of dividing by zero).
pub(crate) fn orthogonalize(a: &mut [f32], len: usize, r: usize, eps: f32) {
    for c in 0..r {
        let (done, rest) = a.split_at_mut((c + 1) * len);
        let v = &mut done[c * len..];
        let norm = dot(v, v).sqrt();
        let inv = 1.0 / (norm + eps);
        v.iter_mut().for_each(|x| *x *= inv);
        for later in rest.chunks_exact_mut(len) {
            let d = dot(v, later);
            axpy(later, -d, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_match_hand_computed_values() {
        // m = [[1, 2, 3], [4, 5, 6]], q = [[1, 0], [0, 1], [1, 1]] given transposed.
        let m = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let qt = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0];
        let mut pt = [0.0; 4];
        project(&m, &qt, &mut pt, 2, 3, 2);
        // m·q = [[4, 5], [10, 11]], transposed.
        assert_eq!(pt, [4.0, 10.0, 5.0, 11.0]);
        let p1 = [1.0, 2.0]; // p = [[1], [2]]
        let mut q1 = [0.0; 3];
        project_t(&m, &p1, &mut q1, 2, 3, 1);
        assert_eq!(q1, [9.0, 12.0, 15.0]);
        let mut out = [0.0; 6];
        expand(&p1, &q1, &mut out, 2, 3, 1);
        assert_eq!(out, [9.0, 12.0, 15.0, 18.0, 24.0, 30.0]);
    }

    #[test]
    fn long_dot_products_are_exact_on_integers() {
        let a: Vec<f32> = (0..37).map(|i| i as f32).collect();
        assert_eq!(dot(&a, &a), (0..37).map(|i| (i * i) as f32).sum::<f32>());
    }

    #[test]
    fn orthogonalized_vectors_are_orthonormal() {
        let mut a = vec![3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0];
        orthogonalize(&mut a, 4, 2, 0.0);
        let (c0, c1) = a.split_at(4);
        assert!((dot(c0, c0) - 1.0).abs() < 1e-5);
        assert!((dot(c1, c1) - 1.0).abs() < 1e-5);
        assert!(dot(c0, c1).abs() < 1e-5);
    }
}
