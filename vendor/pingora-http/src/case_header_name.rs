// Copyright 2026 Cloudflare, Inc.
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
// http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

use crate::*;
use bytes::Bytes;
use http::header;

#[derive(Debug, Clone)]
pub struct CaseHeaderName(Bytes);

impl CaseHeaderName {
    pub fn new(name: String) -> Self {
        CaseHeaderName(name.into())
    }
}

impl CaseHeaderName {
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }

    pub fn from_slice(buf: &[u8]) -> Self {
        CaseHeaderName(Bytes::copy_from_slice(buf))
    }
}

/// A trait that converts into case-sensitive header names.
pub trait IntoCaseHeaderName {
    fn into_case_header_name(self) -> CaseHeaderName;

    /// LACQUER PATCH (names parsed once): the name as the header map keys it and as it is
    /// written. Text is parsed into a [`HeaderName`]; a [`HeaderName`] is used as it is, where
    /// it used to be written out as text and parsed back (an allocation and a parse for every
    /// field a proxy adds).
    fn into_header_names(self) -> Result<(HeaderName, CaseHeaderName), header::InvalidHeaderName>
    where
        Self: Sized,
    {
        let case = self.into_case_header_name();
        let name = HeaderName::from_bytes(case.as_slice())?;
        Ok((name, case))
    }

    /// LACQUER PATCH (case map only when needed): the name as the header map keys it, for a
    /// head without a case map, which has no use for the case: a custom [`HeaderName`]'s
    /// titled text was copied for it and dropped.
    fn into_header_name(self) -> Result<HeaderName, header::InvalidHeaderName>
    where
        Self: Sized,
    {
        self.into_header_names().map(|(name, _)| name)
    }
}

impl IntoCaseHeaderName for CaseHeaderName {
    fn into_case_header_name(self) -> CaseHeaderName {
        self
    }

    // LACQUER PATCH (case map only when needed)
    fn into_header_name(self) -> Result<HeaderName, header::InvalidHeaderName> {
        HeaderName::from_bytes(self.as_slice())
    }
}

impl IntoCaseHeaderName for String {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(self.into())
    }

    // LACQUER PATCH (case map only when needed)
    fn into_header_name(self) -> Result<HeaderName, header::InvalidHeaderName> {
        HeaderName::from_bytes(self.as_bytes())
    }
}

impl IntoCaseHeaderName for &'static str {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(self.into())
    }

    // LACQUER PATCH (case map only when needed)
    fn into_header_name(self) -> Result<HeaderName, header::InvalidHeaderName> {
        HeaderName::from_bytes(self.as_bytes())
    }
}

impl IntoCaseHeaderName for HeaderName {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(titled_header_name(&self))
    }

    // LACQUER PATCH (names parsed once)
    fn into_header_names(self) -> Result<(HeaderName, CaseHeaderName), header::InvalidHeaderName> {
        let case = CaseHeaderName(titled_header_name(&self));
        Ok((self, case))
    }

    // LACQUER PATCH (case map only when needed)
    fn into_header_name(self) -> Result<HeaderName, header::InvalidHeaderName> {
        Ok(self)
    }
}

impl IntoCaseHeaderName for &HeaderName {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(titled_header_name(self))
    }

    // LACQUER PATCH (names parsed once)
    fn into_header_names(self) -> Result<(HeaderName, CaseHeaderName), header::InvalidHeaderName> {
        let case = CaseHeaderName(titled_header_name(self));
        Ok((self.clone(), case))
    }

    // LACQUER PATCH (case map only when needed)
    fn into_header_name(self) -> Result<HeaderName, header::InvalidHeaderName> {
        Ok(self.clone())
    }
}

/// LACQUER PATCH (names parsed once): a name with the text to write it as, both known in
/// advance (a proxy's own fields): neither parsed nor copied. The text must be the name in some
/// case.
impl IntoCaseHeaderName for (HeaderName, &'static str) {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(Bytes::from_static(self.1.as_bytes()))
    }

    fn into_header_names(self) -> Result<(HeaderName, CaseHeaderName), header::InvalidHeaderName> {
        debug_assert!(self.0.as_str().eq_ignore_ascii_case(self.1));
        Ok((self.0, CaseHeaderName(Bytes::from_static(self.1.as_bytes()))))
    }

    // LACQUER PATCH (case map only when needed)
    fn into_header_name(self) -> Result<HeaderName, header::InvalidHeaderName> {
        Ok(self.0)
    }
}

/// LACQUER PATCH (names parsed once): a name with the case it is written in, both taken from
/// another head: not parsed again.
impl IntoCaseHeaderName for (HeaderName, CaseHeaderName) {
    fn into_case_header_name(self) -> CaseHeaderName {
        self.1
    }

    fn into_header_names(self) -> Result<(HeaderName, CaseHeaderName), header::InvalidHeaderName> {
        debug_assert!(self.0.as_str().as_bytes().eq_ignore_ascii_case(self.1.as_slice()));
        Ok(self)
    }

    // LACQUER PATCH (case map only when needed)
    fn into_header_name(self) -> Result<HeaderName, header::InvalidHeaderName> {
        Ok(self.0)
    }
}

impl IntoCaseHeaderName for Bytes {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(self)
    }

    // LACQUER PATCH (case map only when needed)
    fn into_header_name(self) -> Result<HeaderName, header::InvalidHeaderName> {
        HeaderName::from_bytes(&self)
    }
}

/// LACQUER PATCH (case map only when needed): the text a head without a case map is written
/// with for `name` (its titled form when it has one, else the map's lower case). A head whose
/// every field was received as this text writes the same bytes without a case map as with one.
pub fn written_without_case(name: &HeaderName) -> &str {
    titled_header_name_str(name).unwrap_or(name.as_str())
}

fn titled_header_name(header_name: &HeaderName) -> Bytes {
    titled_header_name_str(header_name).map_or_else(
        || Bytes::copy_from_slice(header_name.as_str().as_bytes()),
        |s| Bytes::from_static(s.as_bytes()),
    )
}

pub(crate) fn titled_header_name_str(header_name: &HeaderName) -> Option<&'static str> {
    Some(match *header_name {
        header::ACCEPT_RANGES => "Accept-Ranges",
        header::AGE => "Age",
        header::CACHE_CONTROL => "Cache-Control",
        header::CONNECTION => "Connection",
        header::CONTENT_TYPE => "Content-Type",
        header::CONTENT_ENCODING => "Content-Encoding",
        header::CONTENT_LENGTH => "Content-Length",
        header::DATE => "Date",
        header::TRANSFER_ENCODING => "Transfer-Encoding",
        header::HOST => "Host",
        header::SERVER => "Server",
        header::SET_COOKIE => "Set-Cookie",
        // LACQUER PATCH (case map only when needed): more of the names answers commonly carry,
        // so that a head received with them in these forms needs no case map to be written as
        // received (`Via` stays out: a proxy adds it in lower case)
        header::ACCESS_CONTROL_ALLOW_ORIGIN => "Access-Control-Allow-Origin",
        header::ALLOW => "Allow",
        header::CONTENT_DISPOSITION => "Content-Disposition",
        header::CONTENT_LANGUAGE => "Content-Language",
        header::CONTENT_LOCATION => "Content-Location",
        header::CONTENT_RANGE => "Content-Range",
        header::CONTENT_SECURITY_POLICY => "Content-Security-Policy",
        header::ETAG => "ETag",
        header::EXPIRES => "Expires",
        header::LAST_MODIFIED => "Last-Modified",
        header::LINK => "Link",
        header::LOCATION => "Location",
        header::PRAGMA => "Pragma",
        header::REFERRER_POLICY => "Referrer-Policy",
        header::RETRY_AFTER => "Retry-After",
        header::STRICT_TRANSPORT_SECURITY => "Strict-Transport-Security",
        header::VARY => "Vary",
        header::WWW_AUTHENTICATE => "WWW-Authenticate",
        header::X_CONTENT_TYPE_OPTIONS => "X-Content-Type-Options",
        header::X_FRAME_OPTIONS => "X-Frame-Options",
        header::X_XSS_PROTECTION => "X-XSS-Protection",
        // LACQUER PATCH (request case map only when needed): the names requests commonly carry,
        // so that a request received with them in these forms (as browsers, curl and most HTTP
        // libraries write them) is forwarded without a case map
        header::ACCEPT => "Accept",
        header::ACCEPT_ENCODING => "Accept-Encoding",
        header::ACCEPT_LANGUAGE => "Accept-Language",
        header::AUTHORIZATION => "Authorization",
        header::COOKIE => "Cookie",
        header::DNT => "DNT",
        header::IF_MATCH => "If-Match",
        header::IF_MODIFIED_SINCE => "If-Modified-Since",
        header::IF_NONE_MATCH => "If-None-Match",
        header::IF_RANGE => "If-Range",
        header::IF_UNMODIFIED_SINCE => "If-Unmodified-Since",
        header::ORIGIN => "Origin",
        header::RANGE => "Range",
        header::REFERER => "Referer",
        header::UPGRADE_INSECURE_REQUESTS => "Upgrade-Insecure-Requests",
        header::USER_AGENT => "User-Agent",
        // TODO: add more const header here to map to their titled case
        // TODO: automatically upper case the first letter?
        _ => {
            // LACQUER PATCH (request case map only when needed): names with no constant of
            // their own, compared only when the name is none of the above
            return match header_name.as_str() {
                "sec-fetch-dest" => Some("Sec-Fetch-Dest"),
                "sec-fetch-mode" => Some("Sec-Fetch-Mode"),
                "sec-fetch-site" => Some("Sec-Fetch-Site"),
                "sec-fetch-user" => Some("Sec-Fetch-User"),
                "priority" => Some("Priority"),
                "x-requested-with" => Some("X-Requested-With"),
                _ => None,
            };
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_case_header_name() {
        assert_eq!("FoO".into_case_header_name().as_slice(), b"FoO");
        assert_eq!("FoO".to_string().into_case_header_name().as_slice(), b"FoO");
        assert_eq!(header::SERVER.into_case_header_name().as_slice(), b"Server");
    }
}
