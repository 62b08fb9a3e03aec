//! A stored body kept in a memory file, sent to an HTTP/1.1 client with `sendfile(2)`: the head
//! leaves with the body's first bytes and the body never passes through user space (issue 18
//! item 3). Every other case (h2, TLS, a body on the heap) is the caller's copy path.

use crate::storage::body_file::BodyFile;
use pingora_core::protocols::http::ServerSession as HttpSession;
use pingora_error::Result;
use pingora_http::ResponseHeader;
use pingora_proxy::Session;

/// What [`send_with_file_body`] wrote.
pub enum FileSend {
    /// The head and the whole body.
    Whole,
    /// The head alone: the caller writes the body (not plain HTTP/1.1 over TCP).
    HeadOnly,
    /// Nothing: the session is not HTTP/1.1, the caller writes the head and the body.
    Nothing(Box<ResponseHeader>),
}

/// Writes `head` and the body in `file` to an HTTP/1.1 client over plain TCP (Pingora's
/// `write_response_with_file_body`, a vendored patch), and ends the response. The head skips
/// Pingora's downstream modules, which Lacquer does not use.
pub async fn send_with_file_body(
    session: &mut Session,
    head: Box<ResponseHeader>,
    file: &BodyFile,
) -> Result<FileSend> {
    let HttpSession::H1(h1) = &mut *session.downstream_session else {
        return Ok(FileSend::Nothing(head));
    };
    if !h1
        .write_response_with_file_body(head, file.fd(), file.len())
        .await?
    {
        return Ok(FileSend::HeadOnly);
    }
    session.write_response_body(None, true).await?;
    Ok(FileSend::Whole)
}
