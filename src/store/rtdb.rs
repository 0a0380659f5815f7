//! RTDB store (coming).
