//! The little dense linear algebra PowerSGD needs, on row-major f32 slices.

/// `out (n×r) = a (n×m) · b (m×r)`.
pub(crate) fn matmul(a: &[f32], b: &[f32], out: &mut [f32], n: usize, m: usize, r: usize) {
    out.iter_mut().for_each(|v| *v = 0.0);
    for i in 0..n {
        let row = &a[i * m..(i + 1) * m];
        let o = &mut out[i * r..(i + 1) * r];
        for (j, &x) in row.iter().enumerate() {
            let bj = &b[j * r..(j + 1) * r];
            o.iter_mut().zip(bj).for_each(|(o, &y)| *o += x * y);
        }
    }
}

/// `out (m×r) = aᵀ · p` for `a (n×m)`, `p (n×r)`.
pub(crate) fn matmul_t(a: &[f32], p: &[f32], out: &mut [f32], n: usize, m: usize, r: usize) {
    out.iter_mut().for_each(|v| *v = 0.0);
    for i in 0..n {
        let row = &a[i * m..(i + 1) * m];
        let pi = &p[i * r..(i + 1) * r];
        for (j, &x) in row.iter().enumerate() {
            let o = &mut out[j * r..(j + 1) * r];
            o.iter_mut().zip(pi).for_each(|(o, &y)| *o += x * y);
        }
    }
}

/// `out (n×m) = p (n×r) · qᵀ (q is m×r)`, scaled by `scale`.
pub(crate) fn outer(
    p: &[f32],
    q: &[f32],
    out: &mut [f32],
    n: usize,
    m: usize,
    r: usize,
    scale: f32,
) {
    for i in 0..n {
        let pi = &p[i * r..(i + 1) * r];
        for j in 0..m {
            let qj = &q[j * r..(j + 1) * r];
            let dot: f32 = pi.iter().zip(qj).map(|(a, b)| a * b).sum();
            out[i * m + j] = dot * scale;
        }
    }
}

/// Gram-Schmidt on the `r` columns of `a (n×r)`: orthonormal columns (a column that is zero up
/// to `eps` stays near zero instead of dividing by zero).
pub(crate) fn orthogonalize(a: &mut [f32], n: usize, r: usize, eps: f32) {
    for c in 0..r {
        let norm = (0..n)
            .map(|i| a[i * r + c] * a[i * r + c])
            .sum::<f32>()
            .sqrt();
        let inv = 1.0 / (norm + eps);
        (0..n).for_each(|i| a[i * r + c] *= inv);
        for later in c + 1..r {
            let dot: f32 = (0..n).map(|i| a[i * r + c] * a[i * r + later]).sum();
            (0..n).for_each(|i| a[i * r + later] -= dot * a[i * r + c]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_match_hand_computed_values() {
        // a = [[1, 2, 3], [4, 5, 6]], b = [[1, 0], [0, 1], [1, 1]]
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let b = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
        let mut ab = [0.0; 4];
        matmul(&a, &b, &mut ab, 2, 3, 2);
        assert_eq!(ab, [4.0, 5.0, 10.0, 11.0]);
        let p = [1.0, 2.0]; // 2×1
        let mut atp = [0.0; 3];
        matmul_t(&a, &p, &mut atp, 2, 3, 1);
        assert_eq!(atp, [9.0, 12.0, 15.0]);
        let mut o = [0.0; 6];
        outer(&p, &atp, &mut o, 2, 3, 1, 0.5);
        assert_eq!(o, [4.5, 6.0, 7.5, 9.0, 12.0, 15.0]);
    }

    #[test]
    fn orthogonalized_columns_are_orthonormal() {
        let mut a = vec![3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0];
        orthogonalize(&mut a, 4, 2, 0.0);
        let col = |c: usize| (0..4).map(|i| a[i * 2 + c]).collect::<Vec<f32>>();
        let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(a, b)| a * b).sum::<f32>();
        let (c0, c1) = (col(0), col(1));
        assert!((dot(&c0, &c0) - 1.0).abs() < 1e-5);
        assert!((dot(&c1, &c1) - 1.0).abs() < 1e-5);
        assert!(dot(&c0, &c1).abs() < 1e-5);
    }
}
